"""A Connect stream driven message by message as raw bytes, for tests that play a generator
(a broken or hostile one too: anything can be sent). Responses are read on a thread, so
every wait has a deadline and says what it waited for."""

from __future__ import annotations

import queue
import threading

import grpc

from streamrl.v1 import rollout_pb2 as pb
from streamrl.wire.channels import GRPC_OPTIONS

CONNECT = "/streamrl.v1.Rollout/Connect"


def open_insecure(port: int) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)


def hello(generator_id: str, capacity: int = 4) -> pb.ConnectRequest:
    return pb.ConnectRequest(hello=pb.Hello(generator_id=generator_id, pool="p", capacity=capacity, engine="torch"))


class ConnectStream:
    def __init__(self, channel: grpc.Channel):
        self._requests: queue.Queue = queue.Queue()
        call = channel.stream_stream(CONNECT, request_serializer=None,
                                     response_deserializer=pb.ConnectResponse.FromString)
        self._call = call(iter(self._requests.get, None))
        self._responses: queue.Queue = queue.Queue()
        self.error: grpc.RpcError | None = None
        """How the stream ended (None: still open, or ended OK)."""
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self._responses.put(response)
        except grpc.RpcError as err:
            self.error = err
        finally:
            self.ended.set()
            self._responses.put(None)

    def send(self, message: pb.ConnectRequest | bytes) -> None:
        self._requests.put(message if isinstance(message, bytes) else message.SerializeToString())

    def next(self, kind: str, timeout_s: float = 10.0) -> pb.ConnectResponse:
        """The next response, which must be of `kind` (welcome, assign, ...)."""
        try:
            response = self._responses.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no {kind} from the trainer within {timeout_s}s") from None
        if response is None:
            raise AssertionError(f"the stream ended ({self.error}) while waiting for a {kind}")
        assert response.WhichOneof("kind") == kind, f"expected a {kind}, got {response}"
        return response

    def end(self, timeout_s: float = 10.0) -> grpc.RpcError | None:
        """Wait for the trainer to end the stream; its error (None: it ended OK)."""
        if not self.ended.wait(timeout_s):
            raise AssertionError(f"the trainer did not end the stream within {timeout_s}s")
        self._requests.put(None)  # releases gRPC's thread waiting for our next message
        return self.error

    def close(self, timeout_s: float = 10.0) -> grpc.RpcError | None:
        """Half-close our side (the replica leaves) and wait for the trainer to end the stream."""
        self._requests.put(None)
        return self.end(timeout_s)
