"""A small HTTP/1.1 keep-alive client for the load shapes.

The bench client shares the machine with the server it measures. httpx spent ~1.9 ms of CPU
per request (0.18 of a core at c32 x 1 text on 2 cores, taken from the server's forwards); a
user measuring a server runs a load generator written for it (wrk, oha). This one does only
what the shapes need: POST and GET with a body, a pool of persistent connections to one
host, `Content-Length` or chunked responses. Its requests are ordinary HTTP/1.1; the server
cannot tell them from any other client's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit


class HTTPError(Exception):
    """The connection failed or the response could not be read."""


class _Closed(Exception):
    """The server closed the connection before answering (an idle keep-alive timed out)."""


@dataclass
class Response:
    status_code: int
    headers: dict[str, str]  # names lower-cased
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def request(self, head: bytes, body: bytes) -> tuple[Response, bool]:
        """One exchange; (response, whether the connection may be reused)."""
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise _Closed
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise HTTPError(f"bad status line {status_line[:80]!r}")
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            content = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            content = await self._chunked()
        else:
            content = await self.reader.read()
            return Response(int(parts[1]), headers, content), False
        return Response(int(parts[1]), headers, content), headers.get("connection", "").lower() != "close"

    async def _chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            size = int((await self.reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


class Client:
    """Persistent connections to the host of `base_url`, one per request in flight."""

    def __init__(self, base_url: str, *, timeout_s: float) -> None:
        url = urlsplit(base_url)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 80
        self.timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._host_header = f"{self.host}:{self.port}".encode()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    async def post(self, path: str, content: bytes, headers: dict[str, str] | None = None) -> Response:
        return await self.request("POST", path, content, headers)

    async def get(self, path: str) -> Response:
        return await self.request("GET", path, b"")

    async def request(
        self, method: str, path: str, content: bytes, headers: dict[str, str] | None = None
    ) -> Response:
        lines = [f"{method} {path} HTTP/1.1".encode(), b"host: " + self._host_header]
        lines += [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
        if content or method == "POST":
            lines.append(b"content-length: %d" % len(content))
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        while True:
            reused = bool(self._idle)
            connection = self._idle.pop() if reused else None
            try:
                if connection is None:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port), self.timeout_s
                    )
                    connection = _Connection(reader, writer)
                response, reusable = await asyncio.wait_for(connection.request(head, content), self.timeout_s)
            except (_Closed, ConnectionError) as exc:
                if connection is not None:
                    connection.close()
                if reused:  # an idle connection the server had closed: once more on a new one
                    continue
                raise HTTPError(f"{type(exc).__name__}: {exc or 'the server closed the connection'}") from exc
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                if connection is not None:
                    connection.close()
                raise HTTPError(f"{type(exc).__name__}: {exc}") from exc
            except BaseException:
                if connection is not None:  # cancelled mid-exchange: the connection is unusable
                    connection.close()
                raise
            if reusable:
                self._idle.append(connection)
            else:
                connection.close()
            return response
