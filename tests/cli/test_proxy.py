"""`vllm-srun proxy` as a process in front of real HTTP servers in this process.

The upstreams are small ASGI apps under uvicorn, so a test can hold a response half-written
or see when a request body's first bytes arrive: what a buffering proxy would get wrong.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from helpers import Proc, free_port, read_until_closed

# The upstreams here are toy ASGI apps, not vllm-srun: upstream's contract does not apply to them.
pytestmark = pytest.mark.contract_exempt("toy upstreams behind the proxy")


class Upstream:
    """A real HTTP server that says who it is, streams on demand and reports when a request
    body's first chunk arrived; on a port the OS picks as it binds, or on `port` (to come back
    where one was)."""

    def __init__(self, name: str, port: int | None = None) -> None:
        self.name = name
        self.port = port or 0
        self.release = threading.Event()
        self.got_first_chunk = threading.Event()
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/headers":
            body = json.dumps([[k.decode(), v.decode()] for k, v in scope["headers"]]).encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
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
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_config=None, lifespan="off", interface="asgi3"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
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


def start_proxy(tmp_path: Path, *upstreams: str, options: tuple[str, ...] = ()) -> tuple[Proc, str]:
    args = [sys.executable, "-m", "vllm_srun.cli", "proxy", "--listen", "127.0.0.1:0"]
    args += ["--check-interval-s", "0.2", *options, "--upstream", *upstreams]
    proc = Proc(args, tmp_path / f"proxy-{time.monotonic_ns()}.log")
    url = f"http://127.0.0.1:{proc.listening_port(timeout_s=30)}"
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
            assert time.monotonic() < deadline, "the replica that came back got no traffic"
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


# Connection hygiene (issue 22, M4 and L1): real sockets on 127.0.0.1, each test bounded.


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[Upstream, str]]:
    upstream = Upstream("a").start()
    options = ("--header-timeout-s", "1", "--body-idle-s", "1", "--max-connections", "40")
    options += ("--max-upstream-connections", "2")
    proc, url = start_proxy(tmp_path, f"http://127.0.0.1:{upstream.port}", options=options)
    yield upstream, url
    proc.stop()
    upstream.release.set()
    upstream.stop()


def test_silent_half_sent_and_trickling_connections_are_closed(guarded: tuple[Upstream, str]) -> None:
    _, url = guarded
    silent = [connect(url) for _ in range(10)]
    half = [connect(url) for _ in range(10)]
    for sock in half:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    body = [connect(url) for _ in range(5)]
    for sock in body:  # headers done, body announced and never sent
        sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
    trickle = connect(url)
    started = time.monotonic()
    # One header byte every 0.2 s: each byte is in time, the headers as a whole are not.
    for byte in b"GET /who HTTP/1.1\r\nX-Slow: " + b"a" * 20:
        try:
            trickle.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.2)
    got, _ = read_until_closed(trickle, 5)
    assert time.monotonic() - started < 4 and got.startswith(b"HTTP/1.1 408"), got
    for sock in silent + half:
        got, waited = read_until_closed(sock, 5)
        assert got.startswith(b"HTTP/1.1 408") and waited < 3, got
    for sock in body:
        read_until_closed(sock, 5)
    # The proxy still serves, on the connections it kept free.
    assert httpx.get(url + "/who", timeout=5).status_code == 200


def test_the_connection_cap_answers_503_at_once(guarded: tuple[Upstream, str]) -> None:
    _, url = guarded
    held = [connect(url) for _ in range(40)]
    # No wait for them to be accepted: the proxy accepts in the order the connections were made,
    # so the next one is counted after these. A wait would only spend the time they have: being
    # silent, they are closed --header-timeout-s after their accept, and the cap with them.
    extra = connect(url)
    got, waited = read_until_closed(extra, 5)
    assert got.startswith(b"HTTP/1.1 503") and b"too many open connections" in got and waited < 1
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 5
    while True:  # closed ones are counted out as the server sees them go
        try:
            assert httpx.get(url + "/who", timeout=5).status_code == 200
            break
        except (httpx.HTTPError, AssertionError):
            assert time.monotonic() < deadline, "the closed connections were never counted out"
            time.sleep(0.1)


def test_forwarding_headers_are_the_proxys_own(guarded: tuple[Upstream, str]) -> None:
    _, url = guarded
    spoofed = {
        "X-Forwarded-For": "6.6.6.6",
        "X-Forwarded-Host": "evil.example",
        "X-Forwarded-Proto": "https",
        "Forwarded": "for=6.6.6.6",
        "X-Real-IP": "6.6.6.6",
    }
    reply = httpx.get(url + "/headers", headers=spoofed, timeout=5)
    headers: list[list[str]] = reply.json()
    names = [k for k, _ in headers]
    seen = dict(headers)
    assert names.count("x-forwarded-for") == 1 and seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-host"] == url.removeprefix("http://")
    assert seen["x-forwarded-proto"] == "http"
    assert "forwarded" not in seen and "x-real-ip" not in seen
    assert "6.6.6.6" not in reply.text and "evil.example" not in reply.text


@pytest.mark.parametrize("target", [b"*", b"example.com:443", b"@x"])
def test_a_bad_request_target_is_400(guarded: tuple[Upstream, str], target: bytes) -> None:
    _, url = guarded
    sock = connect(url)
    sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    got, _ = read_until_closed(sock, 5)
    # llhttp refuses some of these itself ("Invalid HTTP request"); `*` parses, and is refused after.
    assert got.startswith(b"HTTP/1.1 400"), got
    assert target != b"*" or b"request target" in got, got
    # An absolute-form target is served (RFC 9112 section 3.2.2).
    sock = connect(url)
    sock.sendall(b"GET http://x/who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got, _ = read_until_closed(sock, 5)
    assert got.startswith(b"HTTP/1.1 200") and b"a GET /who 0" in got
    assert got.lower().count(b"\r\ndate:") == 1, "the replica's own, not a second from the proxy"


def test_the_upstream_pool_is_bounded(guarded: tuple[Upstream, str]) -> None:
    upstream, url = guarded
    # Two held streams take both upstream connections (--max-upstream-connections 2).
    streams = [httpx.stream("GET", url + "/stream", timeout=10) for _ in range(2)]
    replies = [s.__enter__() for s in streams]
    try:
        lines = [r.iter_lines() for r in replies]  # kept: a dropped iterator closes its response
        assert [next(it) for it in lines] == ["first", "first"]
        third: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: third.append(httpx.get(url + "/who", timeout=10)))
        waiter.start()
        waiter.join(1.0)
        assert not third, "a third upstream connection was opened"
        upstream.release.set()
        assert [list(it) for it in lines] == [["second"], ["second"]]
        waiter.join(5)
        assert third and third[0].status_code == 200
    finally:
        for s in streams:
            s.__exit__(None, None, None)
