"""A loopback TCP proxy that stands for the link between two datacenters: it forwards
bytes with a bandwidth cap (shared by every connection, per direction) and a one-way
latency, and counts what crosses it. For tests and benchmarks; runs on its own thread.
"""

from __future__ import annotations

import asyncio
import threading
import time


class _Pacer:
    """Serialises a direction's bytes onto a link of `bytes_per_s`."""

    def __init__(self, bytes_per_s: float | None):
        self.bytes_per_s = bytes_per_s
        self._free_at = 0.0

    def reserve(self, n: int) -> float:
        """Monotonic time at which n bytes have been put on the link."""
        now = time.monotonic()
        if not self.bytes_per_s:
            return now
        start = max(now, self._free_at)
        self._free_at = start + n / self.bytes_per_s
        return self._free_at


class LinkProxy:
    def __init__(self, target_host: str, target_port: int, bandwidth_mbps: float | None = None,
                 latency_ms: float = 0.0, listen_host: str = "127.0.0.1", cut_down_after: int | None = None):
        self.target = (target_host, target_port)
        self.latency_s = latency_ms / 1000
        rate = bandwidth_mbps * 1e6 / 8 if bandwidth_mbps else None
        self._pacers = {"down": _Pacer(rate), "up": _Pacer(rate)}
        self.bytes = {"down": 0, "up": 0}
        """Bytes forwarded: "up" client -> target, "down" target -> client."""
        self.num_connections = 0
        self.cut_down_after = cut_down_after
        """Break every open connection once this many bytes have gone down (one time)."""
        self._writers: list[asyncio.StreamWriter] = []
        self._listen_host = listen_host
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="link-proxy", daemon=True)
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self._listen_host}:{self.port}"

    def start(self) -> LinkProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, self._listen_host, 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def reset_counters(self) -> None:
        self.bytes = {"down": 0, "up": 0}

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            target_r, target_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers += [client_w, target_w]
        try:
            await asyncio.gather(self._pipe(client_r, target_w, "up"), self._pipe(target_r, client_w, "down"),
                                 return_exceptions=True)
        except asyncio.CancelledError:  # the proxy is stopping
            pass

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """Read as fast as data comes; deliver each piece once the link has carried it
        and the latency has passed, in order."""
        pending: asyncio.Queue = asyncio.Queue()

        async def deliver():
            while True:
                due, data = await pending.get()
                if data is None:
                    break
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if direction == "down" and self.cut_down_after is not None:
                    room = self.cut_down_after - self.bytes["down"]
                    if room < len(data):
                        writer.write(data[:max(room, 0)])
                        self.bytes["down"] += max(room, 0)
                        self.cut_down_after = None
                        for w in self._writers:  # the link drops: every connection breaks
                            w.transport.abort()
                        break
                writer.write(data)
                await writer.drain()
                self.bytes[direction] += len(data)
            writer.close()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(64 * 1024):
                await pending.put((self._pacers[direction].reserve(len(data)) + self.latency_s, data))
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            sender.cancel()
            raise
        await pending.put((0.0, None))
        await asyncio.gather(sender, return_exceptions=True)
