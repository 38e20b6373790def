"""Weight transfer: throughput of FetchWeights (chunked, checksummed, resumable) against a
raw gRPC byte stream on loopback in the same run; then time-to-new-version for 1, 4 and
8 generators behind an emulated slow inter-datacenter link, with and without the in-pool
relay. Prints tables and, as the last line, a JSON object.

    python bench/weights.py [--size-mb 256] [--link-mbps 100] [--latency-ms 20] [--out runs/bench-weights]

Each invocation writes into a new directory under --out (bench/provenance.py): the tiny model
it publishes (model/). Its servers run in this process, so it measures no run directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import grpc
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.generator.agent import GeneratorAgent  # noqa: E402
from streamrl.generator.relay import Relay  # noqa: E402
from streamrl.generator.torch_engine import TorchEngine  # noqa: E402
from streamrl.messages import WeightsNotice  # noqa: E402
from streamrl.metrics import ServiceMetrics  # noqa: E402
from streamrl.models import build_tiny_model, load_model  # noqa: E402
from streamrl.weights import WeightStore  # noqa: E402
from streamrl.wire.channels import GRPC_OPTIONS  # noqa: E402
from streamrl.wire.transfer import WeightSource, fetch_blob  # noqa: E402
from tests.integration.inproc import AgentThread, LoopThread, TrainerServer  # noqa: E402
from tests.linkproxy import LinkProxy  # noqa: E402

CHUNK = 1 << 20
RAW_METHOD = "/bench.Raw/Stream"


async def raw_server(blob: bytes) -> tuple[grpc.aio.Server, int]:
    """A gRPC server (asyncio, like the product's) streaming the blob as raw 1 MiB messages:
    no protobuf, no checksums."""

    async def stream(request, context):
        view = memoryview(blob)
        for o in range(0, len(blob), CHUNK):
            yield bytes(view[o : o + CHUNK])

    handler = grpc.method_handlers_generic_handler(
        "bench.Raw", {"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def timed(make) -> float:
    t0 = time.perf_counter()
    await make()
    return time.perf_counter() - t0


def throughput(size_mb: int, repeats: int) -> dict:
    tensors = {"w": torch.randn(size_mb * (1 << 20) // 4)}
    trainer = TrainerServer(WeightStore(1, CHUNK))
    version = trainer.store.publish(1, tensors)
    notice = WeightsNotice(1, version.size_bytes, version.num_chunks, version.sha256)
    raw_loop = LoopThread()
    raw, raw_port = raw_loop.call(raw_server(version.blob))

    async def measure() -> tuple[float, float]:
        # Interleaved, best of `repeats` each, so drift on a shared machine hits both alike.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{raw_port}", options=GRPC_OPTIONS) as raw_ch, \
                grpc.aio.insecure_channel(f"127.0.0.1:{trainer.port}", options=GRPC_OPTIONS) as ch:
            call = raw_ch.unary_stream(RAW_METHOD)
            source = WeightSource(ch)

            async def raw_fetch():
                return b"".join([m async for m in call(b"")])

            raw_times, ours_times = [], []
            for _ in range(repeats):
                raw_times.append(await timed(raw_fetch))
                ours_times.append(await timed(lambda: fetch_blob(source, notice)))
            return min(raw_times), min(ours_times)

    raw_s, ours_s = asyncio.run(measure())
    raw_loop.call(raw.stop(0))
    raw_loop.close()
    trainer.stop()
    mb = version.size_bytes / 1e6
    return {"size_mb": round(mb, 1), "raw_mb_per_s": round(mb / raw_s, 1), "fetch_mb_per_s": round(mb / ours_s, 1),
            "fetch_over_raw": round(raw_s / ours_s, 3)}


def time_to_version(model_dir: Path, num_generators: int, relay: bool, link_mbps: float, latency_ms: float,
                    versions: int = 3) -> dict:
    trainer = TrainerServer(WeightStore(2, CHUNK), relay_pools=frozenset({"remote"}) if relay else frozenset())
    link = LinkProxy("127.0.0.1", trainer.port, bandwidth_mbps=link_mbps, latency_ms=latency_ms).start()
    agents = []
    for i in range(num_generators):
        engine = TorchEngine(load_model(model_dir), 1, eos_token_id=2)
        agent = GeneratorAgent(engine, link.address, f"remote-{i}", "remote", ServiceMetrics("generator"),
                               relay=Relay(2, CHUNK) if relay else None)
        agents.append(AgentThread(agent))
    while trainer.num_connected() < num_generators:
        time.sleep(0.01)
    base = {k: v.detach().clone() for k, v in load_model(model_dir).named_parameters()}
    latencies, crossed = [], []
    for v in range(1, versions + 1):
        before = link.bytes["down"]
        t0 = time.perf_counter()
        notice = trainer.publish(v, {k: t + 0.001 * v for k, t in base.items()})
        while not all(a.agent.engine.policy_version == v for a in agents):
            time.sleep(0.002)
        latencies.append(time.perf_counter() - t0)
        crossed.append((link.bytes["down"] - before) / notice.size_bytes)
    for a in agents:
        a.stop()
    trainer.stop()
    link.stop()
    return {"generators": num_generators, "relay": relay, "seconds": round(sorted(latencies)[len(latencies) // 2], 3),
            "copies_over_link": round(sum(crossed) / len(crossed), 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--link-mbps", type=float, default=100.0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--out", default="runs/bench-weights", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    torch.set_num_threads(1)
    tp = throughput(args.size_mb, args.repeats)
    print(f"loopback, {tp['size_mb']} MB: raw gRPC {tp['raw_mb_per_s']} MB/s, FetchWeights {tp['fetch_mb_per_s']} MB/s "
          f"({tp['fetch_over_raw']:.0%} of raw)")
    model_dir = build_tiny_model(inv.dir / "model", seed=0)
    rows = [time_to_version(model_dir, n, relay, args.link_mbps, args.latency_ms)
            for n in (1, 4, 8) for relay in (False, True)]
    size_mb = os.path.getsize(model_dir / "model.safetensors") / 1e6
    print(f"\ntime to new version over a {args.link_mbps:g} Mbit/s, {args.latency_ms:g} ms link "
          f"(model {size_mb:.1f} MB; median of 3 versions)")
    print(f"{'generators':>10} {'relay':>6} {'seconds':>8} {'copies over link':>17}")
    for r in rows:
        print(f"{r['generators']:>10} {str(r['relay']):>6} {r['seconds']:>8.3f} {r['copies_over_link']:>17.2f}")
    print(inv.report({"throughput": tp, "time_to_version": rows,
                      "link": {"mbps": args.link_mbps, "latency_ms": args.latency_ms}}))


if __name__ == "__main__":
    main()
