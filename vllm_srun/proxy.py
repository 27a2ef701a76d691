"""`vllm-srun proxy`: one published port in front of the app replicas.

A small ASGI reverse proxy run by uvicorn. Requests go round-robin to the upstreams that
answer their health check; a replica that refuses a connection is taken out at once and put
back when its check answers again. Both directions stream: a request body is forwarded as it
arrives, and a response is sent on chunk by chunk as the replica writes it, so a job's event
stream reaches the client event by event (a buffering proxy would hold it until the job ends).

An upstream's host name may stand for several replicas (`http://app:8000` under compose,
where the service name resolves to every replica): each address it resolves to is one target,
and the names are resolved again at every health round, so `--scale app=N` needs no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import structlog

log = structlog.get_logger("vllm_srun.proxy")

# RFC 9110 section 7.6.1: connection-specific fields are not forwarded.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


@dataclass
class Target:
    """One replica address, and whether its last health check (or connection) succeeded."""

    url: str
    host_header: str
    healthy: bool = True


@dataclass
class Upstreams:
    """The targets of the given upstream URLs, kept current by `check` rounds."""

    urls: list[str]
    health_path: str = "/health/live"
    targets: list[Target] = field(default_factory=list)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def pick(self, skip: set[str]) -> Target | None:
        """The next healthy target round-robin, not one in `skip` (tried for this request)."""
        live = [t for t in self.targets if t.healthy and t.url not in skip]
        if not live:
            return None
        return live[next(self._turn) % len(live)]

    async def resolve(self) -> None:
        """Targets for every address each upstream's host resolves to; health kept by URL."""
        known = {t.url: t for t in self.targets}
        fresh: list[Target] = []
        loop = asyncio.get_running_loop()
        for url in self.urls:
            parts = urlsplit(url)
            host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("upstream_unresolved", upstream=url, error=str(exc))
                continue
            for address in dict.fromkeys(str(info[4][0]) for info in infos):
                shown = f"[{address}]" if ":" in address else address
                target_url = f"{parts.scheme}://{shown}:{port}"
                fresh.append(known.get(target_url) or Target(target_url, parts.netloc))
        self.targets = fresh

    async def check(self, client: httpx.AsyncClient) -> None:
        """One health round: resolve again, then ask every target."""
        await self.resolve()

        async def one(target: Target) -> None:
            try:
                reply = await client.get(target.url + self.health_path, timeout=2.0)
                healthy = reply.status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy != target.healthy:
                log.info("upstream_health", upstream=target.url, healthy=healthy)
            target.healthy = healthy

        await asyncio.gather(*(one(t) for t in self.targets))


class Proxy:
    """The ASGI app: `Proxy(urls)`; `check_interval_s` between health rounds."""

    def __init__(self, urls: list[str], *, health_path: str = "/health/live", check_interval_s: float = 2.0):
        self.upstreams = Upstreams(urls, health_path)
        self.check_interval_s = check_interval_s
        self.client: httpx.AsyncClient | None = None
        self._checks: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # No read timeout: an event stream may be quiet for as long as a job runs.
                timeout = httpx.Timeout(None, connect=2.0)
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
                self.client = httpx.AsyncClient(timeout=timeout, limits=limits)
                await self.upstreams.check(self.client)
                self._checks = asyncio.get_running_loop().create_task(self._check_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._checks is not None:
                    self._checks.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._checks
                if self.client is not None:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _check_loop(self) -> None:
        assert self.client is not None
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                await self.upstreams.check(self.client)
            except Exception:  # a failed round must not end the checks
                log.exception("health_round_failed")

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert self.client is not None
        headers = [
            (k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP and k.lower() != b"host"
        ]
        client_addr = scope.get("client")
        if client_addr:
            headers.append((b"x-forwarded-for", client_addr[0].encode()))
        host = dict(scope["headers"]).get(b"host")
        if host:
            headers.append((b"x-forwarded-host", host))
        path = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            path += b"?" + scope["query_string"]
        body = _Body(receive)
        tried: set[str] = set()
        while True:
            target = self.upstreams.pick(tried)
            if target is None:
                await _unavailable(send)
                return
            tried.add(target.url)
            request = self.client.build_request(
                scope["method"],
                target.url + path.decode("latin-1"),
                headers=[*headers, (b"host", target.host_header.encode())],
                content=body.stream(),
            )
            try:
                response = await self.client.send(request, stream=True)
            except httpx.TransportError as exc:
                if body.started or not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                    await _unavailable(send, f"upstream {target.url} failed: {type(exc).__name__}")
                    return
                target.healthy = False  # refused before any byte was sent: try the next one
                log.warning("upstream_down", upstream=target.url, error=str(exc))
                continue
            break
        try:
            await _relay(response, receive, send, body)
        finally:
            await response.aclose()


class _Body:
    """The client's request body as an async stream, read from ASGI `receive` as it comes."""

    def __init__(self, receive: Any) -> None:
        self.receive = receive
        self.started = False
        self.done = False

    async def stream(self) -> AsyncIterator[bytes]:
        while not self.done:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise httpx.ReadError("the client went away")
            self.done = not message.get("more_body", False)
            chunk = message.get("body", b"")
            if chunk:
                self.started = True
                yield chunk


async def _relay(response: httpx.Response, receive: Any, send: Any, body: _Body) -> None:
    """Send `response` on as it arrives; stop reading it when the client disconnects."""
    headers = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})

    async def forward() -> None:
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def disconnected() -> None:
        if not body.done:  # the upstream answered before reading it all: drain the rest
            async for _ in body.stream():
                pass
        while (await receive())["type"] != "http.disconnect":
            pass

    relay = asyncio.ensure_future(forward())
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relay, watch):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError, OSError):
                await task
    if relay.done() and not relay.cancelled() and relay.exception() is not None:
        log.warning("upstream_stream_failed", error=str(relay.exception()))


async def _unavailable(send: Any, message: str = "no app replica is healthy") -> None:
    body = json.dumps(
        {"error": {"code": "unavailable", "message": message, "type": "server_error", "param": None}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def serve(
    listen: str, upstreams: list[str], *, health_path: str, check_interval_s: float, graceful_stop_s: float
) -> None:
    """Run the proxy on `listen` (HOST:PORT) until SIGINT or SIGTERM; connections still open
    `graceful_stop_s` after the signal (an event stream stays open for as long as its job runs)
    are closed then."""
    import uvicorn

    host, _, port = listen.rpartition(":")
    app = Proxy(upstreams, health_path=health_path, check_interval_s=check_interval_s)
    config = uvicorn.Config(
        app,
        host=host.strip("[]") or "127.0.0.1",
        port=int(port),
        log_config=None,
        access_log=False,
        interface="asgi3",
        lifespan="on",
        timeout_graceful_shutdown=graceful_stop_s,
    )
    uvicorn.Server(config).run()
