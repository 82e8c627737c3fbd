"""An SMTP server on loopback that offers PIPELINING (RFC 2920) and checks that the client
really uses it, and uses it right; or, told not to offer it, checks that the client waits.

aiosmtpd does not offer PIPELINING, and a server that answers each command as it arrives
cannot tell a client that pipelines from one that waits. This one is an `asyncio.Protocol`
that sees the bytes as they arrive: it answers everything it holds at once, when its input
runs dry (as Postfix does), and records which commands came in each read. A client that
pipelines sends MAIL, RCPT and DATA in one write, so they arrive in one read; a client that
waits for each reply sends one command per read. It also records what a client must never do:
send anything after DATA before the 354 (`early`), or commands in one read to a server that
did not offer PIPELINING (`unasked`).

Replies are scripted by address, as in `support.mail_servers`: a sender `bounce553@` is
refused at MAIL, recipients `reject550@` and `defer451@` at RCPT. DATA without an accepted
recipient gets 554, unless `lenient_data` makes it answer 354 anyway, which RFC 2920 asks the
client to meet with a lone dot (what came instead is kept in `unaddressed`). A MAIL inside an
open transaction gets 503, as from a real server. `drop_groups` hangs up on the next N
transactions as soon as they arrive (before any reply), `drop_after_message` once the message
is in, `stall` never answers DATA, `extra_reply` follows the reply to MAIL with one nobody
asked for, and `say(line)` sends one to every open connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from support.server_runner import LOOPBACK, serve_in_thread

_NO_RECIPIENT = b"554 5.5.1 no valid recipients\r\n"


@dataclass(frozen=True)
class Received:
    """A message the server took."""

    mail_from: str
    recipients: tuple[str, ...]
    mail_options: tuple[str, ...]
    content: bytes  # as the client meant it: the dot-stuffing undone, CRLF line ends
    session: int


@dataclass
class Session:
    """What one connection saw: the commands of every read, the messages' bytes."""

    number: int
    reads: list[list[str]] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class PipeliningServer:
    """The server's script and records (shared with its thread under `lock`)."""

    pipelining: bool = True
    lenient_data: bool = False
    drop_groups: int = 0
    drop_after_message: bool = False
    stall: bool = False
    extra_reply: bytes = b""
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: list[Session] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    unaddressed: list[bytes] = field(default_factory=list)  # data after DATA, no recipient
    early: list[bytes] = field(default_factory=list)  # bytes sent after DATA, before 354
    unasked: list[list[str]] = field(default_factory=list)  # reads of several commands
    rcpt_seen: threading.Event = field(default_factory=threading.Event)
    _live: list[_Conversation] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None

    def url(self, query: str = "") -> str:
        return f"smtp://127.0.0.1:{self.port}?starttls=false{'&' + query if query else ''}"

    def transaction_reads(self) -> list[list[str]]:
        """The reads that held a MAIL command, in every session."""
        with self.lock:
            return [r for s in self.sessions for r in s.reads if "MAIL" in r]

    def say(self, line: bytes) -> None:
        """Write `line` on every open connection, unasked."""
        assert self._loop is not None
        for conversation in list(self._live):
            self._loop.call_soon_threadsafe(conversation.write, line)


class _Conversation(asyncio.Protocol):
    def __init__(self, server: PipeliningServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.replies: list[bytes] = []
        self.in_data = False
        self.mail_from: str | None = None
        self.mail_options: tuple[str, ...] = ()
        self.recipients: list[str] = []
        with server.lock:
            self.session = Session(len(server.sessions) + 1)
            server.sessions.append(self.session)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server._live.append(self)
        transport.write(b"220 pipelining.test ESMTP\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.server._live:
            self.server._live.remove(self)
        self.session.ended.set()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def hang_up(self) -> None:
        self.replies.clear()
        self.buffer = b""
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        commands: list[str] = []
        while self.buffer:
            if self.in_data:
                if not self.message():
                    break
                continue
            line, found, rest = self.buffer.partition(b"\r\n")
            if not found:
                break
            self.buffer = rest
            verb = line[:4].upper().decode("ascii", "replace")
            commands.append(verb)
            self.command(verb, line)
            if verb == "DATA" and self.in_data and self.buffer:
                with self.server.lock:
                    self.server.early.append(self.buffer)
            if self.transport is None or self.transport.is_closing():
                return
        with self.server.lock:
            if commands:
                self.session.reads.append(commands)
            if len(commands) > 1 and not self.server.pipelining:
                self.server.unasked.append(commands)
        if commands and "MAIL" in commands and self.server.drop_groups > 0:
            self.server.drop_groups -= 1
            self.hang_up()
            return
        if self.replies:
            self.write(b"".join(self.replies))
            self.replies.clear()

    def command(self, verb: str, line: bytes) -> None:
        argument = line[5:].decode("ascii", "replace")
        if verb in ("EHLO", "HELO"):
            offers = [b"250-pipelining.test", b"250-SIZE 1000000"]
            if self.server.pipelining:
                offers.append(b"250-PIPELINING")
            self.replies.append(b"\r\n".join([*offers, b"250 8BITMIME"]) + b"\r\n")
        elif verb == "MAIL":
            address, _, options = argument.partition(">")
            address = address.split("<", 1)[-1]
            if self.mail_from is not None:
                self.replies.append(b"503 5.5.1 nested MAIL command\r\n")
                return
            if address.startswith("bounce553@"):
                self.replies.append(b"553 5.1.8 sender rejected\r\n")
                return
            self.mail_from = address
            self.mail_options = tuple(options.split())
            self.replies.append(b"250-2.1.0 sender\r\n250 2.1.0 ok\r\n" + self.server.extra_reply)
        elif verb == "RCPT":
            address = argument.partition("<")[2].partition(">")[0]
            self.server.rcpt_seen.set()
            if self.mail_from is None:
                self.replies.append(b"503 5.5.1 MAIL first\r\n")
            elif address.startswith("reject550@"):
                self.replies.append(b"550 5.1.1 <" + address.encode() + b">: unknown\r\n")
            elif address.startswith("defer451@"):
                self.replies.append(b"451 4.7.1 greylisted\r\n")
            else:
                self.recipients.append(address)
                self.replies.append(b"250 2.1.5 ok\r\n")
        elif verb == "DATA":
            if self.server.stall:
                return
            if not self.recipients and not self.server.lenient_data:
                self.replies.append(_NO_RECIPIENT)
                return
            self.in_data = True
            self.replies.append(b"354 end with <CRLF>.<CRLF>\r\n")
        elif verb == "RSET":
            self.reset()
            self.replies.append(b"250 2.0.0 ok\r\n")
        elif verb == "NOOP":
            self.replies.append(b"250 2.0.0 ok\r\n")
        elif verb == "QUIT":
            self.replies.append(b"221 2.0.0 bye\r\n")
            self.write(b"".join(self.replies))
            self.replies.clear()
            assert self.transport is not None
            self.transport.close()
        else:
            self.replies.append(b"502 5.5.2 not implemented\r\n")

    def message(self) -> bool:
        """Take a whole message from the buffer, if it is there; False to wait for more."""
        if self.buffer.startswith(b".\r\n"):
            raw, self.buffer = b"", self.buffer[3:]
        else:
            raw, found, rest = self.buffer.partition(b"\r\n.\r\n")
            if not found:
                return False
            raw, self.buffer = raw + b"\r\n", rest
        self.in_data = False
        # RFC 5321, 4.5.2: the first dot of a line that starts with one is the client's.
        content = b"".join(
            line[1:] if line.startswith(b".") else line for line in raw.splitlines(keepends=True)
        )
        with self.server.lock:
            if not self.recipients:
                self.server.unaddressed.append(content)
                self.replies.append(_NO_RECIPIENT)
            else:
                assert self.mail_from is not None
                self.server.received.append(
                    Received(
                        self.mail_from,
                        tuple(self.recipients),
                        self.mail_options,
                        content,
                        self.session.number,
                    )
                )
                self.replies.append(b"250 2.0.0 queued\r\n")
        self.reset()
        if self.server.drop_after_message:
            self.hang_up()
            return False
        return True

    def reset(self) -> None:
        self.mail_from = None
        self.mail_options = ()
        self.recipients = []


@contextmanager
def pipelining_smtp(server: PipeliningServer | None = None) -> Iterator[PipeliningServer]:
    """The server on 127.0.0.1 (a free port), served from its own thread until the end."""
    server = server or PipeliningServer()

    async def listen() -> asyncio.Server:
        server._loop = asyncio.get_running_loop()
        return await server._loop.create_server(lambda: _Conversation(server), LOOPBACK, 0)

    async def wind_down() -> None:
        for conversation in list(server._live):
            if conversation.transport is not None:
                conversation.transport.close()

    with serve_in_thread("pipelining SMTP server", listen, wind_down) as running:
        server.port = running.port
        yield server
