"""A hostile SMTP server: a raw asyncio implementation whose every reply to a message is
scripted, for the fault-injection suite.

aiosmtpd is a well-behaved server; this one is written on bare streams so that it can do
what real servers and networks do on a bad day: take the whole message and drop the
connection before its `250`, stall before answering, answer with NUL bytes, invalid UTF-8
or a megabyte-long line, defer in bursts. It runs on a thread of its own (so that a
synchronous test and a worker process can use it) and records, per delivery key, every copy
it *took*: each message received in full and then accepted or dropped without an answer,
which is what the recipient's mailbox would get. Refused messages are counted apart. With
`Script.pipelining` it offers PIPELINING, and reads a pipelined envelope line by line as it
would read one command at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser

from support.server_runner import LOOPBACK, other_tasks_end, serve_in_thread

# What the server does once it holds a whole message.
ACCEPT = "accept"  # 250
DROP = "drop"  # close the connection without a reply: the client cannot know
SLOW = "slow"  # wait `Script.slow_seconds`, then 250
HOLD = "hold"  # wait until the test releases it, then 250
DEFER = "defer"  # 451: not taken
REJECT = "reject"  # 554: not taken
GARBAGE = "garbage"  # 250 with NUL bytes, control characters and invalid UTF-8: taken
GARBAGE_DEFER = "garbage_defer"  # the same text with 451: not taken
HUGE = "huge"  # 250 followed by a megabyte on the same line (unreadable to a client): taken
RAW = "raw"  # `Script.raw` as the reply (taken if it starts with 2)
TAKEN = frozenset({ACCEPT, DROP, SLOW, HOLD, GARBAGE, HUGE})
NASTY = b"\x00\x1b[2J\xff\xfe\xed\xa0\x80 \xf0\x28\x8c\x28 <ada@example.com>"


@dataclass(frozen=True)
class Copy:
    """One message the server took."""

    delivery_key: str
    message_id: str
    attempt: int
    data_at: float  # wall-clock time the DATA command arrived, before any of the message


@dataclass
class Script:
    """`reply(delivery_key, nth)` picks what to do with the nth copy (1-based) of a key."""

    reply: Callable[[str, int], str] = lambda key, nth: ACCEPT
    pipelining: bool = False
    slow_seconds: float = 2.0
    raw: bytes = b"250 OK\r\n"
    release: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)


class HostileSmtpServer:
    """The server's state; `copies` and `refused` are what a test asserts on."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self._lock = threading.Lock()
        self.copies: dict[str, list[Copy]] = defaultdict(list)
        self.refused: dict[str, int] = defaultdict(int)
        self.seen: dict[str, int] = defaultdict(int)
        self.sessions = 0
        self.port = 0
        self.stopping = asyncio.Event()

    def taken(self, key: str) -> list[Copy]:
        with self._lock:
            return list(self.copies.get(key, []))

    def taken_count(self) -> int:
        with self._lock:
            return sum(len(c) for c in self.copies.values())

    def url(self, query: str = "") -> str:
        return f"smtp://127.0.0.1:{self.port}?starttls=false{'&' + query if query else ''}"

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.sessions += 1
        try:
            await self._converse(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 hostile.test ESMTP\r\n")
        while True:
            line = await reader.readline()
            if not line:
                return
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                offer = b"250-PIPELINING\r\n" if self.script.pipelining else b""
                writer.write(b"250-hostile.test\r\n" + offer + b"250 8BITMIME\r\n")
            elif verb in (b"MAIL", b"RCPT", b"RSET", b"NOOP"):
                writer.write(b"250 OK\r\n")
            elif verb == b"QUIT":
                writer.write(b"221 bye\r\n")
                await writer.drain()
                return
            elif verb == b"DATA":
                data_at = time.time()
                writer.write(b"354 go ahead\r\n")
                await writer.drain()
                content = await reader.readuntil(b"\r\n.\r\n")
                if not await self._answer(content, data_at, writer):
                    return
            else:
                writer.write(b"502 not implemented\r\n")
            await writer.drain()

    async def _answer(self, content: bytes, data_at: float, writer: asyncio.StreamWriter) -> bool:
        """Reply to one message; False when the connection is to be dropped."""
        headers = BytesHeaderParser().parsebytes(content)
        key = str(headers["X-Leasebox-Delivery-Key"])
        attempt = int(str(headers["X-Leasebox-Attempt"] or "0"))
        with self._lock:
            self.seen[key] += 1
            action = self.script.reply(key, self.seen[key])
            if action in TAKEN or (action == RAW and self.script.raw.startswith(b"2")):
                self.copies[key].append(Copy(key, str(headers["Message-ID"]), attempt, data_at))
            else:
                self.refused[key] += 1
        if action == DROP:
            writer.transport.abort()
            return False
        if action == SLOW:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.script.slow_seconds)
        if action == HOLD:
            self.script.holding.set()
            while not (self.script.release.is_set() or self.stopping.is_set()):  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # released by the test's thread
        if action == RAW:
            writer.write(self.script.raw)
        elif action == GARBAGE:
            writer.write(b"250 queued as " + NASTY + b"\r\n")
        elif action == GARBAGE_DEFER:
            writer.write(b"451 4.3.0 " + NASTY + b"\r\n")
        elif action == HUGE:
            writer.write(b"250 queued as " + b"Z" * 1_000_000 + b"\r\n")
        elif action == DEFER:
            writer.write(b"451 4.3.0 try again later\r\n")
        elif action == REJECT:
            writer.write(b"554 5.7.1 rejected\r\n")
        else:
            writer.write(b"250 2.0.0 queued\r\n")
        return True


@contextmanager
def hostile_smtp(script: Script | None = None) -> Iterator[HostileSmtpServer]:
    """The server on 127.0.0.1 (a free port), served from its own thread until the end."""
    server = HostileSmtpServer(script)

    async def listen() -> asyncio.Server:
        server.stopping = asyncio.Event()
        return await asyncio.start_server(server._session, LOOPBACK, 0)

    async def wind_down() -> None:
        # Sessions still open (a stalled or held reply) finish, and close, on their own.
        server.stopping.set()
        await other_tasks_end()

    with serve_in_thread("hostile SMTP server", listen, wind_down) as running:
        server.port = running.port
        try:
            yield server
        finally:
            server.script.release.set()  # a held reply is let go, so its session can end
