"""`vllm-srun proxy`: one published port in front of the app replicas.

A small ASGI reverse proxy run by uvicorn. Requests go round-robin to the upstreams that
answer their health check; a replica that refuses a connection is taken out at once and put
back when its check answers again. Both directions stream: a request body is forwarded as it
arrives, and a response is sent on chunk by chunk as the replica writes it, so a job's event
stream reaches the client event by event (a buffering proxy would hold it until the job ends).

What a client controls is bounded (`vllm_srun.cli.connections`): a connection's headers arrive
within a deadline and its body never idles past a timeout, open connections are capped, and so
are the connections to the upstreams (a request that finds the pool full waits at most
`POOL_WAIT_S`, then gets 503 with Retry-After). `X-Forwarded-For`, `-Host` and `-Proto` are this
proxy's own, from the socket peer and the request: whatever a client sent under those names (or
`Forwarded`, `X-Real-IP`) is dropped, never passed on.

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
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import structlog

from vllm_srun.cli.connections import ConnectionLimits

log = structlog.get_logger("vllm_srun.cli.proxy")

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
# Set by this proxy alone: a client's own would let it choose the address the replicas log.
FORWARDING = frozenset(
    {
        b"forwarded",
        b"x-forwarded-for",
        b"x-forwarded-host",
        b"x-forwarded-proto",
        b"x-forwarded-port",
        b"x-real-ip",
    }
)
# How long a request waits for a free upstream connection before it is answered 503.
POOL_WAIT_S = 5.0
RETRY_AFTER_S = 1
MAX_UPSTREAM_CONNECTIONS = 512


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

    def __init__(
        self,
        urls: list[str],
        *,
        health_path: str = "/health/live",
        check_interval_s: float = 2.0,
        max_upstream_connections: int = MAX_UPSTREAM_CONNECTIONS,
    ):
        self.upstreams = Upstreams(urls, health_path)
        self.check_interval_s = check_interval_s
        self.max_upstream_connections = max_upstream_connections
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
                # No read timeout: an event stream may be quiet for as long as a job runs. Every
                # open request holds one upstream connection: the pool bounds them all.
                timeout = httpx.Timeout(None, connect=2.0, pool=POOL_WAIT_S)
                limits = httpx.Limits(
                    max_connections=self.max_upstream_connections,
                    max_keepalive_connections=min(64, self.max_upstream_connections),
                )
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
        path = scope.get("raw_path") or scope["path"].encode()
        if not path.startswith(b"/"):  # the server's protocol refuses these first; never forwarded
            await _error(send, 400, "bad_request", "invalid_request_error", "invalid request target")
            return
        headers = [
            (k, v)
            for k, v in scope["headers"]
            if k.lower() not in HOP_BY_HOP and k.lower() not in FORWARDING and k.lower() != b"host"
        ]
        client_addr = scope.get("client")  # the socket peer: uvicorn runs with proxy_headers off
        if client_addr:
            headers.append((b"x-forwarded-for", client_addr[0].encode()))
        host = dict(scope["headers"]).get(b"host")
        if host:
            headers.append((b"x-forwarded-host", host))
        headers.append((b"x-forwarded-proto", scope.get("scheme", "http").encode()))
        if scope.get("query_string"):
            path += b"?" + scope["query_string"]
        body = _Body(receive)
        # Only a request that has a body is sent with one: a streamed content would go out
        # chunked on every GET, and the app refuses a body without a content type (415).
        given = dict(scope["headers"])
        has_body = b"transfer-encoding" in given or given.get(b"content-length", b"0").strip() not in (b"", b"0")
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
                content=body.stream() if has_body else None,
            )
            try:
                response = await self.client.send(request, stream=True)
            except httpx.PoolTimeout:
                await _unavailable(send, "every upstream connection is in use", retry_after_s=RETRY_AFTER_S)
                return
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


async def _unavailable(
    send: Any, message: str = "no app replica is healthy", *, retry_after_s: int | None = None
) -> None:
    await _error(send, 503, "unavailable", "server_error", message, retry_after_s=retry_after_s)


async def _error(
    send: Any, status: int, code: str, kind: str, message: str, *, retry_after_s: int | None = None
) -> None:
    body = json.dumps({"error": {"code": code, "message": message, "type": kind, "param": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(
    listen: str,
    upstreams: list[str],
    *,
    health_path: str,
    check_interval_s: float,
    graceful_stop_s: float,
    limits: ConnectionLimits | None = None,
    max_upstream_connections: int = MAX_UPSTREAM_CONNECTIONS,
) -> None:
    """Run the proxy on `listen` (HOST:PORT; port 0 takes one the OS picks, which the
    `listening` line names) until SIGINT or SIGTERM; connections still open `graceful_stop_s`
    after the signal (an event stream stays open for as long as its job runs) are closed then."""
    import uvicorn

    from vllm_srun.cli.managed import tcp_socket

    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    # Bound here, not by uvicorn, so that the port the OS chose for port 0 can be logged.
    sock = tcp_socket(host, int(port))
    shown = f"[{host}]" if ":" in host else host
    # Printed whatever the log level (the proxy logs warnings only), as the worker prints
    # "worker ready": the line a supervisor or a test reads the port from.
    print(f"listening: http://{shown}:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    app = Proxy(
        upstreams,
        health_path=health_path,
        check_interval_s=check_interval_s,
        max_upstream_connections=max_upstream_connections,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=sock.getsockname()[1],
        log_config=None,
        access_log=False,
        interface="asgi3",
        lifespan="on",
        timeout_graceful_shutdown=graceful_stop_s,
        # scope["client"] is the socket peer: uvicorn would otherwise take it from a client's
        # X-Forwarded-For when it connects from 127.0.0.1.
        proxy_headers=False,
        # The replica's Date and Server are relayed; the proxy adds none of its own.
        server_header=False,
        date_header=False,
        **(limits or ConnectionLimits()).uvicorn_options(),
    )
    uvicorn.Server(config).run(sockets=[sock])
