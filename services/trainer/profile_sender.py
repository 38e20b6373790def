"""The replica's end of the Connect stream `streamrl profile` measures, in a process of its own
as a replica is: `python -m streamrl.trainer.profile_sender ADDRESS ...` connects to the
profiling process's servicer, answers each Work with samples the way a replica's engine thread
hands them over (up to `--burst` per decode step, each to the event loop alone, a step of
`--step-s` seconds off the CPU between them) and writes, on stdout, `cpu <seconds>` (its
process's CPU time, every thread, gRPC's own included) as each round's first sample is asked
for: the difference between two marks over `--per-round` is what sending one sample cost this
end (the profiling process, which asks for a round only once the last one is in, measures the
other end). It runs until the profiling process ends the stream or stops it.

Only the stream's messages and their conversion, no engine and no torch: it stands in for a
replica's sending, not its generating.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import sys
import threading
import time

import grpc

from streamrl.messages import Hello, Work
from streamrl.samples import Sample
from streamrl.v1 import rollout_pb2 as pb
from streamrl.wire.convert import request_to_pb, response_from_pb

GENERATOR_ID = "profile-sender"


def profile_sample(work: Work, index: int, completion_tokens: int, generator_id: str) -> Sample:
    """The sample a replica would send for `work`'s `index`: the shape of a real one (ids 4..19,
    its behaviour log-probs), no meaning."""
    ids = tuple(4 + (index + k) % 16 for k in range(completion_tokens))
    return Sample(work.prompt_id, index, ids, (-1.0,) * completion_tokens, work.min_policy_version, "length",
                  generator_id, incarnation=work.incarnation)


async def send(address: str, per_round: int, burst: int, step_s: float, completion_tokens: int,
               capacity: int) -> None:
    loop = asyncio.get_running_loop()
    outbox: asyncio.Queue = asyncio.Queue()
    finished: queue.Queue = queue.Queue()

    async def requests():  # as the agent streams: Hello, then whatever the engine thread hands over
        yield request_to_pb(Hello(GENERATOR_ID, "default", capacity, "torch", 0))
        while (msg := await outbox.get()) is not None:
            yield request_to_pb(msg)

    def engine() -> None:  # as a replica's engine thread: up to `burst` finished samples per decode step
        while (item := finished.get()) is not None:
            done = [item]
            while len(done) < burst and not finished.empty():
                done.append(finished.get_nowait())
            for work, index in done:  # built and handed over one by one, as Worker._emit and the agent do
                loop.call_soon_threadsafe(outbox.put_nowait, profile_sample(work, index, completion_tokens,
                                                                            GENERATOR_ID))
            time.sleep(step_s)  # the next decode step, off this process's CPU

    thread = threading.Thread(target=engine, name="profile-engine", daemon=True)
    thread.start()
    received = 0
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream("/streamrl.v1.Rollout/Connect",
                                     request_serializer=pb.ConnectRequest.SerializeToString,
                                     response_deserializer=pb.ConnectResponse.FromString)(requests())
        try:
            while (response := await call.read()) is not grpc.aio.EOF:  # pyright: ignore[reportAttributeAccessIssue] (typeshed's grpc lacks aio.EOF)
                assert isinstance(response, pb.ConnectResponse)
                work = response_from_pb(response)
                if not isinstance(work, Work):
                    continue  # the Welcome
                for index in work.sample_indices:
                    if received % per_round == 0:
                        print(f"cpu {time.process_time():.6f}", flush=True)
                    received += 1
                    finished.put((work, index))
        except grpc.aio.AioRpcError as err:  # the profile stopped its server: it has its marks
            print(f"stream ended: {err.code().name}", file=sys.stderr)
        finally:
            finished.put(None)
            outbox.put_nowait(None)
            thread.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamrl.trainer.profile_sender",
                                description="The replica's end of the Connect stream `streamrl profile` measures.")
    p.add_argument("address", help="the profiling process's servicer, host:port")
    p.add_argument("--per-round", type=int, required=True, help="samples the profile asks for per round")
    p.add_argument("--burst", type=int, default=1, help="samples finished per decode step (default 1)")
    p.add_argument("--step-s", type=float, default=0.002, help="seconds of a decode step (default 0.002)")
    p.add_argument("--completion-tokens", type=int, required=True, help="generated tokens of each sample")
    p.add_argument("--capacity", type=int, required=True, help="the replica's batch capacity (its Hello)")
    args = p.parse_args(argv)
    for name in ("per_round", "burst", "completion_tokens", "capacity"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    asyncio.run(send(args.address, args.per_round, args.burst, args.step_s, args.completion_tokens, args.capacity))
    return 0


if __name__ == "__main__":
    sys.exit(main())
