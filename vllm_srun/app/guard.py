"""What a browser may make a server on a developer's machine do, checked before any route runs.

A request with a body must say `application/json` (or an NDJSON type on `POST /v1/jobs`), else
415: a web page cannot send one without a CORS preflight, which the server never grants. Where a
Host allow-list is set (`serve` sets one without an API key; `--allowed-hosts` widens it, `*`
for none) a request for any other host is 400, which stops DNS rebinding. A unix socket is not
checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from vllm_srun.app.serving import PHASES

JSON_TYPES = frozenset({"application/json"})
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/json-lines"})
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
JOBS_PATH = "/v1/jobs"
FILES_PATH = "/v1/files"
# Refused before any phase ran: every phase of the contract's Server-Timing, each zero.
NO_TIMING = ", ".join(f"{phase};dur=0" for phase in PHASES).encode()


def default_hosts(bind: str, *, api_key: str | None) -> frozenset[str] | None:
    """The allow-list `serve` applies: None (any host) with a key or on a wildcard bind,
    whose names cannot be known; else the bind address and localhost's names."""
    if api_key or bind in WILDCARDS:
        return None
    return LOCAL_NAMES | {bind.strip("[]").lower()}


def parse_hosts(text: str) -> frozenset[str] | None:
    """`--allowed-hosts a,b`: those names; `*`: any host."""
    names = {name.strip().lower() for name in text.split(",") if name.strip()}
    return None if "*" in names else frozenset(names)


def _host_name(host: bytes) -> str:
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):  # [::1]:8000
        return text[1 : text.find("]")] if "]" in text else text
    return text.rpartition(":")[0] if text.count(":") == 1 else text


def _has_body(headers: dict[bytes, bytes]) -> bool:
    if b"transfer-encoding" in headers:
        return True
    length = headers.get(b"content-length", b"0").strip()
    return length not in (b"", b"0")


async def _refuse(send: Any, status: int, code: str, message: str) -> None:
    body = json.dumps(
        {"error": {"code": code, "message": message, "type": "invalid_request_error", "param": None}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"server-timing", NO_TIMING))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BrowserGuard:
    """ASGI middleware around the app: see the module docstring."""

    def __init__(self, app: Any, *, allowed_hosts: Iterable[str] | None) -> None:
        self.app = app
        self.allowed_hosts = None if allowed_hosts is None else frozenset(allowed_hosts)

    def __getattr__(self, name: str) -> Any:  # the app's own attributes (state, ...) stay reachable
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        # A unix socket (scope "server" is (path, None)) is out of a web page's reach.
        server = scope.get("server")
        if self.allowed_hosts is not None and server is not None and server[1] is not None:
            host = _host_name(headers.get(b"host", b""))
            if host not in self.allowed_hosts:
                shown = sorted(self.allowed_hosts)
                await _refuse(
                    send, 400, "invalid_request", f"Host {host[:64]!r} is not served here (allowed: {shown})"
                )
                return
        if _has_body(headers):
            kind = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
            allowed = JSON_TYPES | NDJSON_TYPES if scope["path"] == JOBS_PATH else JSON_TYPES
            if scope["path"] == FILES_PATH:
                # OpenAI's upload is multipart; a page that posts one only stores a file, which
                # runs nothing until a JSON request (a preflighted one) makes it a batch.
                allowed = allowed | {"multipart/form-data"}
            if kind not in allowed:
                await _refuse(
                    send,
                    415,
                    "unsupported_media_type",
                    f"content-type: {kind or 'none'!r}; send the body as {' or '.join(sorted(allowed))}",
                )
                return
        await self.app(scope, receive, send)
