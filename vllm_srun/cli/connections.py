"""Connection hygiene for the HTTP servers `serve` and `proxy` run (uvicorn with httptools).

Per connection (`ConnectionLimits`): the request line and headers complete within
`header_timeout_s` (else 408 and close); a request body never idles `body_idle_s` while the
app is reading it (else 408, or a close once a response has started); past `max_connections`
open ones a new connection gets 503 and is closed; a request target in neither origin nor
absolute form (`GET *`, CONNECT) is a 400 here. Idle keep-alive is uvicorn's `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """What one server allows a connection: see the module docstring."""

    header_timeout_s: float = 10.0
    body_idle_s: float = 30.0
    keep_alive_s: int = 5
    max_connections: int = 1024

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for `uvicorn.Config` that apply these limits."""
        return {"http": guarded_protocol(self), "timeout_keep_alive": self.keep_alive_s}


def _response(status: bytes, message: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: " + str(len(message)).encode() + b"\r\nconnection: close\r\n\r\n" + message
    )


REQUEST_TIMEOUT = _response(b"408 Request Timeout", b"request not received in time")
TOO_MANY_CONNECTIONS = _response(b"503 Service Unavailable", b"too many open connections")


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of `limits` (a subclass per server)."""

    limits: ConnectionLimits = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_head = False  # between a request's first byte and its complete headers
        self._in_body = False  # between complete headers and the end of the body
        self._bad_target = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_body:
            self._arm(self.limits.body_idle_s)  # idle: measured from the last byte
        elif not self._in_head:
            self._start_head()  # a later request on a kept-alive connection
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if not _valid_target(self.url):
            self._disarm()
            self._bad_target = True
            # A parser callback that raises stops the parse; uvicorn answers it 400 and closes.
            raise ValueError("invalid request target")
        self._in_body = True
        self._arm(self.limits.body_idle_s)
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._bad_target:
            msg = "Invalid request target: only origin-form (/path) or absolute-form is served."
        super().send_400_response(msg)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()

    def _start_head(self) -> None:
        # Absolute, not reset by each byte: a trickle of header bytes does not extend it.
        self._in_head = True
        self._arm(self.limits.header_timeout_s)

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._in_body and self.flow.read_paused:
            self._arm(self.limits.body_idle_s)  # the app has not read what it has: not idle
            return
        if not (self._in_head or self._in_body):
            return
        if self.cycle is None or not self.cycle.response_started or self._in_head:
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()


def _valid_target(url: bytes) -> bool:
    return url.startswith(b"/") or url[:7].lower() == b"http://" or url[:8].lower() == b"https://"


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpTools]:
    """A protocol class for `uvicorn.Config(http=...)` that applies `limits`."""
    return type("GuardedHttpTools", (GuardedHttpTools,), {"limits": limits})
