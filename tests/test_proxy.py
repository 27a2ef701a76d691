"""`vllm-srun proxy` as a process in front of real HTTP servers in this process.

The upstreams are small ASGI apps under uvicorn, so a test can hold a response half-written
or see when a request body's first bytes arrive: what a buffering proxy would get wrong.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from helpers import Proc, free_port

# The upstreams here are toy ASGI apps, not vllm-srun: upstream's contract does not apply to them.
pytestmark = pytest.mark.contract_exempt("toy upstreams behind the proxy")


class Upstream:
    """A real HTTP server on a free port that says who it is, streams on demand and reports
    when a request body's first chunk arrived."""

    def __init__(self, name: str, port: int | None = None) -> None:
        self.name = name
        self.port = port or free_port()
        self.release = threading.Event()
        self.got_first_chunk = threading.Event()
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/stream":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
            )
            await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": b"second\n"})
            return
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if size:
                self.got_first_chunk.set()
            if not message.get("more_body"):
                break
        body = f"{self.name} {scope['method']} {path} {size}".encode()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": body})

    def start(self) -> Upstream:
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_config=None, lifespan="off", interface="asgi3"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        assert self.server is not None and self.thread is not None
        self.server.should_exit = True
        self.thread.join(10)


def start_proxy(tmp_path: Path, *upstreams: str) -> tuple[Proc, str]:
    port = free_port()
    args = [sys.executable, "-m", "vllm_srun.cli", "proxy", "--listen", f"127.0.0.1:{port}"]
    args += ["--check-interval-s", "0.2", "--upstream", *upstreams]
    proc = Proc(args, tmp_path / f"proxy-{port}.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.alive(), proc.log()
        try:
            httpx.get(url + "/health/live", timeout=1)
            return proc, url
        except httpx.HTTPError:
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.05)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Upstream, Upstream, str]]:
    a, b = Upstream("a").start(), Upstream("b").start()
    proc, url = start_proxy(tmp_path, f"http://127.0.0.1:{a.port}", f"http://127.0.0.1:{b.port}")
    yield a, b, url
    proc.stop()
    for upstream in (a, b):
        upstream.release.set()
        if upstream.server is not None and not upstream.server.should_exit:
            upstream.stop()


def who(url: str, n: int) -> list[str]:
    return [httpx.get(url + "/who?x=1", timeout=10).text.split()[0] for _ in range(n)]


def test_round_robin_and_paths_queries_bodies_pass_through(two: tuple[Upstream, Upstream, str]) -> None:
    _, _, url = two
    assert sorted(who(url, 4)) == ["a", "a", "b", "b"]
    reply = httpx.post(url + "/v1/x?y=2", content=b"z" * 70000, timeout=10)
    assert reply.status_code == 200 and reply.text.split()[1:] == ["POST", "/v1/x", "70000"]


def test_a_replica_that_goes_away_gets_no_traffic_and_comes_back(two: tuple[Upstream, Upstream, str]) -> None:
    _, b, url = two
    b.stop()
    assert who(url, 6) == ["a"] * 6  # refused connections are retried on the next replica
    again = Upstream("b", port=b.port).start()
    try:
        deadline = time.monotonic() + 10
        while "b" not in who(url, 4):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        again.stop()


def test_no_healthy_replica_is_503_unavailable(tmp_path: Path) -> None:
    proc, url = start_proxy(tmp_path, f"http://127.0.0.1:{free_port()}")
    try:
        reply = httpx.get(url + "/v1/models", timeout=10)
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "unavailable"
    finally:
        proc.stop()


def test_responses_stream_unbuffered(two: tuple[Upstream, Upstream, str]) -> None:
    a, b, url = two
    with httpx.stream("GET", url + "/stream", timeout=10) as reply:
        lines = reply.iter_lines()
        assert next(lines) == "first"  # arrives while the upstream still holds the rest
        a.release.set()
        b.release.set()
        assert next(lines) == "second"


def test_request_bodies_stream_unbuffered(two: tuple[Upstream, Upstream, str]) -> None:
    a, b, url = two
    seen: list[bool] = []

    def body() -> Iterator[bytes]:
        yield b"x" * 1000
        # The upstream has the first chunk before the client sends the rest.
        seen.append(a.got_first_chunk.wait(5) or b.got_first_chunk.wait(0.1))
        yield b"y" * 1000

    reply = httpx.post(url + "/upload", content=body(), timeout=10)
    assert reply.text.endswith(" 2000") and seen == [True]


def test_sigterm_stops_the_proxy_with_a_stream_open(tmp_path: Path) -> None:
    upstream = Upstream("a").start()
    proc, url = start_proxy(tmp_path, f"http://127.0.0.1:{upstream.port}")
    try:
        with httpx.stream("GET", url + "/stream", timeout=30) as reply:
            assert next(reply.iter_lines()) == "first"
            started = time.monotonic()
            proc.proc.send_signal(signal.SIGTERM)
            proc.proc.wait(timeout=15)
        assert time.monotonic() - started < 10, "a held stream kept the proxy from stopping"
    finally:
        proc.stop()
        upstream.release.set()
        upstream.stop()
