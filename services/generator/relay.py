"""A generator's in-pool relay: the weight versions it holds, served to its pool peers over
FetchWeights (so a remote pool receives one copy over the slow link). Runs on the replica's
gRPC server (the service shell's)."""

from __future__ import annotations

import grpc

from streamrl.weights import WeightStore, WeightVersion
from streamrl.wire.transfer import rollout_handler, serve_version


class Relay:
    def __init__(self, keep: int, chunk_bytes: int):
        self.store = WeightStore(keep, chunk_bytes)
        self.address = ""
        """host:port peers dial; set once its server listens."""
        self.bytes_served = 0

    def chunked(self, policy_version: int, blob: bytes) -> WeightVersion:
        """A verified version cut into this relay's chunks (hashes them: call it off the event loop)."""
        return WeightVersion.build(policy_version, blob, self.store.chunk_bytes)

    def hold(self, version: WeightVersion) -> None:
        self.store.add(version)

    def forget(self) -> None:
        """Drop every version held (the trainer restarted: its versions may differ from these)."""
        self.store = WeightStore(self.store.keep, self.store.chunk_bytes)

    def handler(self) -> grpc.GenericRpcHandler:
        return rollout_handler(self.Connect, self.FetchWeights)

    async def FetchWeights(self, request, context):
        async for response in serve_version(self.store.get(request.policy_version), request, context, " here"):
            self.bytes_served += len(response)
            yield response

    async def Connect(self, request_iterator, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a generator relays weights only; dial the trainer")
