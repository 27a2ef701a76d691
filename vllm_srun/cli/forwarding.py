"""The proxy's ASGI app: requests round-robin to healthy replicas, streamed both ways.

A request body is forwarded as it arrives and a response sent on chunk by chunk, so a job's
event stream reaches the client event by event. A replica that refuses a connection is taken
out at once. `X-Forwarded-For`, `-Host` and `-Proto` are this proxy's own: a client's are dropped.
A request that finds the upstream pool full waits `POOL_WAIT_S`, then gets 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import structlog

from vllm_srun.cli.upstreams import Upstreams

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


class Proxy:
    """The ASGI app: `Proxy(urls, max_upstream_connections=N)`; `check_interval_s` between
    health rounds."""

    def __init__(
        self,
        urls: list[str],
        *,
        max_upstream_connections: int,
        health_path: str = "/health/live",
        check_interval_s: float = 2.0,
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
