"""The health port's HTTP server against clients that are not the kubelet or Prometheus.

Each test talks raw bytes over a real socket, so what is checked is what goes over the wire:
the status line, the headers a client relies on, and that the server closes what it should
and keeps answering after it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from leasebox.runtime.probe_http import HEAD_LIMIT, Answer, ProbeHttpServer, request_line

# A bound on any single wait, so that a server which never answers fails the test.
PATIENCE = 10.0


async def hello() -> Answer:
    return Answer.text(200, "hello\n")


async def broken() -> Answer:
    raise RuntimeError("the route failed")


@pytest.fixture
async def server() -> AsyncIterator[tuple[ProbeHttpServer, int]]:
    probe = ProbeHttpServer({"/hello": hello, "/broken": broken}, head_timeout=0.2)
    port = await probe.start("127.0.0.1", 0)
    try:
        yield probe, port
    finally:
        async with asyncio.timeout(PATIENCE):
            await probe.stop()


async def exchange(port: int, request: bytes) -> bytes:
    """Send `request` and read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(PATIENCE):
            return await reader.read()
    finally:
        writer.close()


def parse(reply: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


async def test_a_get_is_answered_with_its_length_and_the_connection_closed(
    server: tuple[ProbeHttpServer, int],
) -> None:
    status, headers, body = parse(
        await exchange(server[1], b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    )
    assert (status, body) == ("HTTP/1.1 200 OK", b"hello\n")
    assert headers["content-length"] == "6"
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["connection"] == "close"


async def test_a_head_gets_the_headers_and_no_body(server: tuple[ProbeHttpServer, int]) -> None:
    status, headers, body = parse(await exchange(server[1], b"HEAD /hello HTTP/1.1\r\n\r\n"))
    assert (status, headers["content-length"], body) == ("HTTP/1.1 200 OK", "6", b"")


async def test_the_query_string_does_not_change_the_route(
    server: tuple[ProbeHttpServer, int],
) -> None:
    status, _, body = parse(await exchange(server[1], b"GET /hello?x=1 HTTP/1.0\r\n\r\n"))
    assert (status, body) == ("HTTP/1.1 200 OK", b"hello\n")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /nowhere HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found"),
        (
            b"POST /hello HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "HTTP/1.1 405 Method Not Allowed",
        ),
        (b"GET /hello\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET hello HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (
            b"GET /" + b"a" * HEAD_LIMIT + b" HTTP/1.1\r\n\r\n",
            "HTTP/1.1 431 Request Header Fields Too Large",
        ),
    ],
    ids=["unknown path", "post", "no version", "no slash", "tls hello", "head too large"],
)
async def test_a_request_it_cannot_serve_gets_its_4xx_and_the_server_goes_on(
    server: tuple[ProbeHttpServer, int], request_bytes: bytes, status: str
) -> None:
    got, headers, _ = parse(await exchange(server[1], request_bytes))
    assert got == status
    if status.startswith("HTTP/1.1 405"):
        assert headers["allow"] == "GET, HEAD"
    assert parse(await exchange(server[1], b"GET /hello HTTP/1.1\r\n\r\n"))[2] == b"hello\n"


async def test_a_failing_route_is_a_500_and_the_server_goes_on(
    server: tuple[ProbeHttpServer, int], caplog: pytest.LogCaptureFixture
) -> None:
    status, _, body = parse(await exchange(server[1], b"GET /broken HTTP/1.1\r\n\r\n"))
    assert (status, body) == ("HTTP/1.1 500 Internal Server Error", b"internal error\n")
    assert "the /broken route failed" in caplog.text
    assert parse(await exchange(server[1], b"GET /hello HTTP/1.1\r\n\r\n"))[2] == b"hello\n"


async def test_a_client_that_never_finishes_its_request_is_disconnected(
    server: tuple[ProbeHttpServer, int],
) -> None:
    # Half a head, then silence: the server closes after its head timeout (0.2 s here),
    # without an answer; the read returns at that close, not at the test's bound.
    assert await exchange(server[1], b"GET /hello HTTP/1.1\r\nHost:") == b""


async def test_stopping_drops_connections_that_are_still_open() -> None:
    probe = ProbeHttpServer({"/hello": hello})  # the default head timeout: 10 s
    port = await probe.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /hello HTTP/1.1\r\n")  # and never the blank line
    await writer.drain()
    try:
        async with asyncio.timeout(PATIENCE):
            await probe.stop()
            assert await closed(reader)
    finally:
        writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (an end of stream or a reset)."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


async def test_a_port_in_use_is_an_oserror_at_start() -> None:
    first = ProbeHttpServer({"/hello": hello})
    port = await first.start("127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match="address already in use"):
            await ProbeHttpServer({"/hello": hello}).start("127.0.0.1", port)
    finally:
        await first.stop()


def test_the_request_line_gives_the_method_and_the_path_without_its_query() -> None:
    assert request_line(b"GET /metrics?name[]=x HTTP/1.1\r\nHost: y\r\n\r\n") == (
        "GET",
        "/metrics",
    )
    assert request_line(b"HEAD /healthz HTTP/1.0\r\n\r\n") == ("HEAD", "/healthz")


def test_the_worker_process_starts_without_a_web_framework() -> None:
    # The health port used to load aiohttp, a quarter of the worker's start-up; only an HTTP
    # mail provider needs it, and it imports it itself.
    code = (
        "import sys, leasebox.cli.worker, leasebox.runtime.process; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'yarl')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
