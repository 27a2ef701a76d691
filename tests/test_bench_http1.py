"""The bench's HTTP/1.1 client against a real socket server: keep-alive reuse, chunked bodies,
and a fresh connection when the server has closed an idle one."""

from __future__ import annotations

import asyncio

import pytest

from bench import http1


class OneShotServer:
    """Answers each connection's requests from a script, then closes it; records connections."""

    def __init__(self, replies_per_connection: list[list[bytes]]) -> None:
        self.scripts = list(replies_per_connection)
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # set when a connection's script has ended and it is closed

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        script = self.scripts[self.connections]
        self.connections += 1
        for reply in script:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            self.requests.append(head + await reader.readexactly(length))
            writer.write(reply)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        self.closed.set()


def fixed(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


CHUNKED = b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"


async def test_reuses_a_connection_and_reconnects_after_the_server_closed_it() -> None:
    server = OneShotServer([[fixed(b"one", b"server-timing: total;dur=1.5\r\n"), CHUNKED], [fixed(b"three")]])
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with http1.Client(f"http://127.0.0.1:{port}", timeout_s=5) as client:
            first = await client.post("/a", b'{"x":1}', {"content-type": "application/json"})
            second = await client.post("/b", b"{}")
            await asyncio.wait_for(server.closed.wait(), 5)  # the first connection's script is done
            third = await client.post("/c", b"{}")
    finally:
        listener.close()
        await listener.wait_closed()
    assert (first.status_code, first.content, first.headers["server-timing"]) == (
        200,
        b"one",
        "total;dur=1.5",
    )
    assert (second.status_code, second.content) == (201, b"abcde")
    assert (third.status_code, third.content) == (200, b"three")
    assert server.connections == 2
    assert server.requests[0].startswith(b"POST /a HTTP/1.1\r\n") and server.requests[0].endswith(b'{"x":1}')


async def test_a_refused_connection_is_an_http_error() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    with pytest.raises(http1.HTTPError):
        async with http1.Client(f"http://127.0.0.1:{port}", timeout_s=5) as client:
            await client.post("/", b"{}")
