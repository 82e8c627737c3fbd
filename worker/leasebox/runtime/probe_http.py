"""Just enough HTTP/1.1 to answer Kubernetes probes and Prometheus scrapes.

The clients are the kubelet and Prometheus, but the port is reachable by anything in the
cluster, so the server is written for the client that misbehaves: a request head must
arrive whole within `HEAD_TIMEOUT` and fit in `HEAD_LIMIT` bytes, an answer must be taken
within `WRITE_TIMEOUT`, and anything but a GET or HEAD of a known path gets its 4xx at
once. One request per connection (`Connection: close`): a probe opens a connection per
check anyway, and a scrape every few seconds gains nothing from keeping one open, while
the server keeps no idle connections to time out. A request body is never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

log = logging.getLogger("leasebox.health")

HEAD_LIMIT = 8192
HEAD_TIMEOUT = 10.0
WRITE_TIMEOUT = 10.0
PLAIN_TEXT = "text/plain; charset=utf-8"
METHODS = ("GET", "HEAD")


@dataclass(frozen=True)
class Answer:
    """A response: status, body, its content type and any further headers."""

    status: int
    body: bytes
    content_type: str = PLAIN_TEXT
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, status: int, text: str) -> Answer:
        return cls(status, text.encode())

    def encode(self, *, with_body: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head + self.body if with_body else head


Route = Callable[[], Awaitable[Answer]]


def request_line(head: bytes) -> tuple[str, str] | Answer:
    """The method and path (query string dropped) of a request head, or the 4xx it earns."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1].startswith(b"/"):
        return Answer.text(400, "bad request\n")
    method = parts[0].decode("ascii", "replace")
    if method not in METHODS:
        return Answer(405, b"method not allowed\n", headers=(("Allow", ", ".join(METHODS)),))
    return method, parts[1].decode("ascii", "replace").partition("?")[0]


class ProbeHttpServer:
    """Answers GET and HEAD of `routes` on a TCP port until `stop()`."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        head_timeout: float = HEAD_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        self._routes = dict(routes)
        self._head_timeout = head_timeout
        self._write_timeout = write_timeout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on `host:port` (0: a free port); the port it listens on. OSError if it
        cannot."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=HEAD_LIMIT)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and drop the connections still open."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            answer, with_body = await self._answer(reader)
            if answer is not None:
                writer.write(answer.encode(with_body=with_body))
                async with asyncio.timeout(self._write_timeout):
                    await writer.drain()
        except (TimeoutError, ConnectionError):
            pass  # a client that stalls or goes away gets nothing more
        except asyncio.CancelledError:
            # Only `stop()` cancels a connection. Ending quietly keeps asyncio from logging
            # the cancellation as an error in the connection's callback (Python 3.11).
            pass
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[Answer | None, bool]:
        """The answer to the request (None: say nothing, just close), and whether its body
        goes with it (not for a HEAD)."""
        try:
            async with asyncio.timeout(self._head_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            return Answer.text(431, "request head too large\n"), True
        except asyncio.IncompleteReadError:
            return None, False  # closed before a whole head
        parsed = request_line(head)
        if isinstance(parsed, Answer):
            return parsed, True
        method, path = parsed
        with_body = method != "HEAD"
        route = self._routes.get(path)
        if route is None:
            return Answer.text(404, "not found\n"), with_body
        try:
            return await route(), with_body
        except Exception:  # a failing route is a 500, never a dead server
            log.exception("the %s route failed", path)
            return Answer.text(500, "internal error\n"), with_body
