"""A hostile HTTP mail API: a raw asyncio HTTP/1.1 server whose every reply is scripted, for
the fault-injection suite.

It reads each request completely (so it knows the message) and then answers as told: a
normal 2xx with an id, ids holding NUL bytes, lone surrogates or a megabyte, a body cut off
mid-way or never finished, no answer at all (the connection dropped), 429 with Retry-After,
bursts of 5xx. Bytes are written by hand so that the reply can be as broken as a real
network makes it. Every response closes its connection. Like the SMTP one it runs on its own
thread and counts, per Idempotency-Key, each copy it *took* (answered 2xx or dropped after
reading it whole); refusals are counted apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from support.server_runner import LOOPBACK, other_tasks_end, serve_in_thread

OK = "ok"  # 202 {"id": "msg-<n>"}
NUL_ID = "nul_id"  # 200 {"id": "abc\u0000def"}
SURROGATE_ID = "surrogate_id"  # 200 {"id": "abc\udc80def"} (a lone surrogate, escaped in JSON)
HUGE_ID = "huge_id"  # 200 with an id of one megabyte
GARBAGE_BODY = "garbage_body"  # 200 with bytes that are neither JSON nor UTF-8
CUT_BODY = "cut_body"  # 200 whose body stops half-way and the connection closes
STALLED_BODY = "stalled_body"  # 200 whose body never finishes
DROP = "drop"  # the request is read, then the connection closes without a reply
THROTTLED = "throttled"  # 429 with Retry-After: `Script.retry_after`
UNAVAILABLE = "unavailable"  # 503
RAW = "raw"  # `Script.raw` written as the whole response (taken if it is a 2xx)
SLOW_OK = "slow_ok"  # 202 after `Script.slow_seconds`
TAKEN = frozenset(
    {OK, NUL_ID, SURROGATE_ID, HUGE_ID, GARBAGE_BODY, CUT_BODY, STALLED_BODY, DROP, SLOW_OK}
)


@dataclass(frozen=True)
class Copy:
    """One request the server took."""

    delivery_key: str
    attempt: int
    recipient: str


@dataclass
class Script:
    """`reply(delivery_key, nth)` picks what to do with the nth copy (1-based) of a key."""

    reply: Callable[[str, int], str] = lambda key, nth: OK
    retry_after: str = "1"
    raw: bytes = b""
    slow_seconds: float = 1.0


@dataclass
class HostileHttpServer:
    script: Script = field(default_factory=Script)
    port: int = 0
    copies: dict[str, list[Copy]] = field(default_factory=lambda: defaultdict(list))
    refused: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    seen: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/send", query: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}{'?' + query if query else ''}"

    def taken(self, key: str) -> list[Copy]:
        with self._lock:
            return list(self.copies.get(key, []))

    def taken_count(self) -> int:
        with self._lock:
            return sum(len(c) for c in self.copies.values())

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._exchange(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:] if line)
        }
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if not lines[0].startswith("POST"):
            # A readiness probe connects and leaves; anything else gets a plain 404.
            writer.write(_response(404, b"{}"))
            await writer.drain()
            return
        request = json.loads(body)
        key = headers.get("idempotency-key", "")
        with self._lock:
            self.seen[key] += 1
            action = self.script.reply(key, self.seen[key])
            if action in TAKEN or (action == RAW and self.script.raw.startswith(b"HTTP/1.1 2")):
                copy = Copy(key, int(request["metadata"].get("attempt", 0)), request["to"])
                self.copies[key].append(copy)
            else:
                self.refused[key].append(action)
            n = sum(len(c) for c in self.copies.values())
        await self._reply(action, n, writer)

    async def _reply(self, action: str, n: int, writer: asyncio.StreamWriter) -> None:
        if action == DROP:
            writer.transport.abort()
            return
        if action == SLOW_OK:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.script.slow_seconds)
        if action == RAW:
            writer.write(self.script.raw)
        elif action == THROTTLED:
            writer.write(
                _response(429, b'{"error": "slow down"}', {"Retry-After": self.script.retry_after})
            )
        elif action == UNAVAILABLE:
            writer.write(_response(503, b'{"error": "try later"}'))
        elif action == NUL_ID:
            writer.write(_response(200, b'{"id": "abc\\u0000def"}'))
        elif action == SURROGATE_ID:
            writer.write(_response(200, b'{"id": "abc\\udc80def", "note": "\\ud800"}'))
        elif action == HUGE_ID:
            writer.write(_response(200, b'{"id": "' + b"9" * 1_000_000 + b'"}'))
        elif action == GARBAGE_BODY:
            writer.write(_response(200, b"\xff\xfe\x00\x00garbage\xed\xa0\x80"))
        elif action == CUT_BODY:
            whole = b'{"id": "msg-cut", "status": "queued"}'
            writer.write(_response(200, whole)[: -len(whole) // 2])
            await writer.drain()
            writer.transport.abort()
            return
        elif action == STALLED_BODY:
            writer.write(_response(200, b'{"id": "msg-stalled"}')[:-5])
            await writer.drain()
            await self.stopping.wait()  # never finished: the client gives up first
        else:
            writer.write(_response(202, b'{"id": "msg-%d", "status": "queued"}' % n))
        await writer.drain()


def _response(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [
        f"HTTP/1.1 {status} Scripted",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@contextmanager
def hostile_http(script: Script | None = None) -> Iterator[HostileHttpServer]:
    """The server on 127.0.0.1 (a free port), served from its own thread until the end."""
    server = HostileHttpServer(script or Script())

    async def listen() -> asyncio.Server:
        server.stopping = asyncio.Event()
        return await asyncio.start_server(server._session, LOOPBACK, 0)

    async def wind_down() -> None:
        # Sessions still open (a stalled or held reply) finish, and close, on their own.
        server.stopping.set()
        await other_tasks_end()

    with serve_in_thread("hostile HTTP server", listen, wind_down) as running:
        server.port = running.port
        yield server
