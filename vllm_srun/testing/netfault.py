"""`FaultProxy`: a TCP proxy that makes a network misbehave, for tests and the bench.

It forwards every connection to one upstream address and, on command, adds latency with
jitter (order kept), resets every open connection (RST, not FIN), blackholes (accepts, then
sends nothing and drops what arrives, as a partition does) and heals. `ThreadedProxy` runs
one on its own event loop in a thread, for code that is not async (subprocess topologies).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_CHUNK = 64 * 1024


class FaultProxy:
    """Listens on `host`:`port` (0: a free one) and forwards to `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self.host, self.port = host, port
        self.latency_s = 0.0
        self.jitter_s = 0.0
        self.blackholed = False
        self.connections_made = 0
        self.resets = 0
        self._rng = random.Random(0)
        self._server: asyncio.Server | None = None
        self._open: set[_Link] = set()
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        # Each connection's handler ends before the loop may: one cancelled at the loop's end
        # is logged by asyncio's streams as an error.
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def delay(self, latency_s: float, jitter_s: float = 0.0) -> None:
        """Each chunk, in each direction, arrives `latency_s` ± up to `jitter_s` late (never
        before the chunk sent ahead of it)."""
        self.latency_s, self.jitter_s = latency_s, jitter_s

    def blackhole(self) -> None:
        """From now on nothing passes, either way, on open connections or new ones; no FIN, no
        RST: what arrives is read and dropped."""
        self.blackholed = True

    def heal(self) -> None:
        """No latency, no blackhole: what is sent from now on passes (what was dropped is lost)."""
        self.latency_s = self.jitter_s = 0.0
        self.blackholed = False

    def reset(self) -> int:
        """Close every open connection with an RST, both sides; how many were open."""
        links = list(self._open)
        for link in links:
            link.abort()
        self.resets += len(links)
        return len(links)

    def _due(self, previous: float) -> float:
        now = asyncio.get_running_loop().time()
        jitter = self._rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
        return max(previous, now + max(0.0, self.latency_s + jitter))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_made += 1
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(writer)
            return
        link = _Link(self, (reader, writer), (up_reader, up_writer))
        self._open.add(link)
        try:
            await link.run()
        finally:
            self._open.discard(link)


class _Link:
    """One client connection and its upstream connection: two pumps, one per direction."""

    def __init__(self, proxy: FaultProxy, client: Any, upstream: Any) -> None:
        self.proxy = proxy
        self.client, self.upstream = client, upstream
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._pump(self.client[0], self.upstream[1])),
            loop.create_task(self._pump(self.upstream[0], self.client[1])),
        ]
        await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        self.abort()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def abort(self) -> None:
        for task in self._tasks:
            task.cancel()
        _abort(self.client[1])
        _abort(self.upstream[1])

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy `reader` to `writer`, chunk by chunk, through the proxy's faults. Chunks wait
        their delay on a queue, so reading goes on while they do (latency, not throughput)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.get_running_loop().create_task(self._send(queue, writer))
        due = 0.0
        try:
            while data := await reader.read(_CHUNK):
                if self.proxy.blackholed:
                    continue  # read and dropped: the peer sees a link that went silent
                due = self.proxy._due(due)
                queue.put_nowait((due, data))
            queue.put_nowait((due, b""))
            await sender
        finally:
            sender.cancel()

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            wait_s = due - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            if self.proxy.blackholed:
                continue  # a partition that began while this chunk was on its way
            writer.write(data)
            await writer.drain()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a middlebox that resets the connection does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ThreadedProxy:
    """A FaultProxy on its own event loop in a daemon thread; each method runs on that loop.
    `reset_every(interval_s)` resets every open connection each `interval_s` until `stop_resets`."""

    def __init__(self, upstream: tuple[str, int], *, port: int = 0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self.proxy = self._call(FaultProxy(upstream, port=port).start())
        self._resetting: asyncio.TimerHandle | None = None

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def port(self) -> int:
        return self.proxy.port

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _run(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self._call(call())  # type: ignore[no-any-return]

    def delay(self, latency_s: float, jitter_s: float = 0.0) -> None:
        self._run(lambda: self.proxy.delay(latency_s, jitter_s))

    def blackhole(self) -> None:
        self._run(self.proxy.blackhole)

    def heal(self) -> None:
        self.stop_resets()
        self._run(self.proxy.heal)

    def reset(self) -> int:
        return self._run(self.proxy.reset)

    def reset_every(self, interval_s: float) -> None:
        def tick() -> None:
            self.proxy.reset()
            self._resetting = self._loop.call_later(interval_s, tick)

        def begin() -> None:
            self._resetting = self._loop.call_later(interval_s, tick)

        self._run(begin)

    def stop_resets(self) -> None:
        def end() -> None:
            if self._resetting is not None:
                self._resetting.cancel()
                self._resetting = None

        self._run(end)

    def close(self) -> None:
        if not self._loop.is_running():
            return
        self.stop_resets()
        self._call(self.proxy.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
