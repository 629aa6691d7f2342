"""The upstream HTTP/1.1 client against small raw asyncio servers: keep-alive reuse, body
framings, a server that drops idle connections, connect errors, timeouts and the pool bound."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
from rllm_sampler_vllm.httpclient import (
    HttpClient,
    HttpConnectError,
    HttpProtocolError,
    Origin,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return lines[0], body


class Server:
    """A raw HTTP server on 127.0.0.1 that counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Origin:
        async def on_connect(reader, writer):
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return Origin.parse(f"http://127.0.0.1:{port}")

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()


def keep_alive_echo(extra: bytes = b"") -> Handler:
    async def handle(reader, writer):
        while True:
            line, body = await read_request(reader)
            payload = line.encode() + b"|" + body
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nx-seen: yes\r\n%s\r\n"
                % (len(payload), extra)
                + payload
            )
            await writer.drain()

    return handle


def test_requests_reuse_one_keep_alive_connection():
    async def main():
        server = Server(keep_alive_echo())
        async with server as origin:
            client = HttpClient()
            answers = [
                await client.request("POST", origin, f"/v1/x{n}", body=b"abc") for n in range(3)
            ]
            await client.aclose()
        return server.connections, answers

    connections, answers = asyncio.run(main())
    assert connections == 1
    assert [a.body for a in answers] == [f"POST /v1/x{n} HTTP/1.1|abc".encode() for n in range(3)]
    assert answers[0].status == 200
    assert answers[0].headers["x-seen"] == "yes"


def test_a_base_path_prefixes_every_request():
    async def main():
        async with Server(keep_alive_echo()) as origin:
            client = HttpClient()
            prefixed = Origin.parse(f"{origin}/worker-3/")
            answer = await client.request("GET", prefixed, "/health")
            await client.aclose()
        return answer.body

    assert asyncio.run(main()) == b"GET /worker-3/health HTTP/1.1|"


def test_chunked_and_close_delimited_bodies_are_read_whole():
    async def chunked(reader, writer):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 201 Created\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async def main():
        server = Server(chunked)
        async with server as origin:
            client = HttpClient()
            first = await client.request("GET", origin, "/a")
            second = await client.request("GET", origin, "/b")
            await client.aclose()
        return server.connections, first, second

    connections, first, second = asyncio.run(main())
    assert connections == 1
    assert (first.status, first.body) == (200, b"hello world")
    assert (second.status, second.body) == (201, b"until the end")


def test_a_connection_the_server_dropped_while_idle_is_replaced_silently():
    async def one_shot(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        # Keep-alive was promised, but the server closes the idle connection.

    async def main():
        server = Server(one_shot)
        async with server as origin:
            client = HttpClient()
            first = await client.request("GET", origin, "/")
            await asyncio.sleep(0.05)
            second = await client.request("GET", origin, "/")
            await client.aclose()
        return server.connections, first.body, second.body

    assert asyncio.run(main()) == (2, b"ok", b"ok")


def test_a_response_cut_off_midway_is_a_protocol_error():
    async def cut(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()

    async def main():
        async with Server(cut) as origin:
            client = HttpClient()
            with pytest.raises(HttpProtocolError, match="middle of a response"):
                await client.request("GET", origin, "/")
            await client.aclose()

    asyncio.run(main())


def test_nothing_listening_is_a_connect_error_naming_the_origin():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def main():
        client = HttpClient()
        with pytest.raises(HttpConnectError, match=f"could not connect to http://127.0.0.1:{port}"):
            await client.request("GET", Origin.parse(f"http://127.0.0.1:{port}"), "/")
        await client.aclose()

    asyncio.run(main())


def test_a_timed_out_request_closes_its_connection():
    async def slow_then_fast(reader, writer):
        await read_request(reader)
        await asyncio.sleep(1.0)

    async def main():
        server = Server(slow_then_fast)
        async with server as origin:
            client = HttpClient()
            with pytest.raises(TimeoutError):
                await client.request("GET", origin, "/", timeout_s=0.1)
            pool = client._pools[origin]
            await client.aclose()
        return pool.open, len(pool.idle)

    assert asyncio.run(main()) == (0, 0)


def test_max_connections_bounds_concurrent_requests_per_origin():
    active = {"now": 0, "max": 0}

    async def slow(reader, writer):
        while True:
            await read_request(reader)
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
            await asyncio.sleep(0.02)
            active["now"] -= 1
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()

    async def main():
        server = Server(slow)
        async with server as origin:
            client = HttpClient(max_connections=2)
            answers = await asyncio.gather(*(client.request("GET", origin, "/") for _ in range(8)))
            await client.aclose()
        return server.connections, [a.status for a in answers]

    connections, statuses = asyncio.run(main())
    assert statuses == [200] * 8
    assert connections == 2
    assert active["max"] == 2


def test_origins_parse_and_print():
    assert str(Origin.parse("http://10.0.0.5:8000/")) == "http://10.0.0.5:8000"
    assert Origin.parse("https://example.org/v").port == 443
    assert Origin.parse("http://[::1]:9000").host_header == "[::1]:9000"
    with pytest.raises(ValueError, match="not an http"):
        Origin.parse("ftp://host")
