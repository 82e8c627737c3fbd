"""The mail transaction on a pooled SMTP connection, driven by the server's replies.

aiosmtplib opens each connection (greeting, EHLO, STARTTLS, AUTH); then this protocol takes
its transport over and speaks every transaction itself. aiosmtplib makes each command a
coroutine of its own, with a lock, a `wait_for` timeout and a parse of the address, and runs
two regular expressions over the whole message (line ends, then dot-stuffing): per message,
more CPU than building the message. Here one transaction is a small state machine run by
`data_received`: each reply writes the next command at once, so the sending task wakes once
per message instead of once per command, and the message goes out as `build_mime` wrote it
(CRLF line ends, a final CRLF), dot-stuffed by one `bytes.replace`.

Replies are read as RFC 5321 (4.2) writes them: three digits, the first 2 to 5, then a space,
a hyphen (another line follows, with the same code) or the end of the line. Anything else,
a line over 8 KiB or a reply over 32 KiB is an *unreadable* reply, and a reply nobody asked
for (a server's 421 before it hangs up) is one too: the connection is closed, since nothing
after it could be paired with a command.

When the server offers PIPELINING (RFC 2920), MAIL, RCPT and DATA go out in one write and
their three replies are read in order, every one of them checked: the first refusal is the
outcome, and if DATA was accepted (354) after a refusal, a lone dot ends the empty message
(RFC 2920, 3.1) instead of sending it. Without PIPELINING each command waits for the reply to
the one before.

Every reply is awaited at most `timeout` seconds. The message's bytes begin after the 354:
only from then on is an outcome ambiguous (`message_sent`). Right before them `before_message`
runs (the expiry check); if it raises, the connection is closed, since the server waits for
data that must not come, and the message was never written. A transaction given a `gate` (a
check that must wait, such as asking the database whether a newer message replaced this one)
pauses at the 354: the sending task awaits the gate, then the message goes out; the fast path
of an ungated transaction, one wake-up per message, stays as it is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

MAX_REPLY_LINE = 8192
MAX_REPLY = 4 * MAX_REPLY_LINE
_CODE_DIGITS = b"0123456789"


class Reply(NamedTuple):
    code: int
    text: str


class WireError(Exception):
    """The connection cannot go on; `message_sent` says whether the message was written."""

    def __init__(self, what: str, *, message_sent: bool) -> None:
        super().__init__(what)
        self.message_sent = message_sent


class ConnectionLost(WireError):
    """The server closed the connection, or it broke."""


class ReplyTimeout(WireError):
    """A reply did not come within the timeout."""


class UnreadableReply(WireError):
    """The server sent something that is not a reply to the command awaiting one."""


class Refused(Exception):
    """The server refused `step` of the transaction (MAIL, RCPT, DATA) with `reply`."""

    def __init__(self, step: str, reply: Reply) -> None:
        super().__init__(f"{step}: {reply.code}")
        self.step = step
        self.reply = reply


MAIL = "MAIL"
RCPT = "RCPT"
DATA = "DATA"
_DOT = "the empty message"
_MESSAGE = "the message"
_COMMAND = "the command"


def parse_replies(buffer: bytes) -> tuple[list[Reply], bytes]:
    """The complete replies at the start of `buffer` and the rest (the start of the next).

    Raises ValueError for anything that is not a reply, or a line or reply too long to be one.
    """
    if (  # the usual case, read at once: one whole reply of one line
        buffer[3:4] == b" "
        and buffer[-2:] == b"\r\n"
        and buffer.find(b"\n") == len(buffer) - 1
        and len(buffer) <= MAX_REPLY_LINE
        and buffer[0] in b"2345"
        and buffer[1] in _CODE_DIGITS
        and buffer[2] in _CODE_DIGITS
    ):
        return [Reply(int(buffer[:3]), buffer[4:-2].decode("utf-8", "replace"))], b""
    replies: list[Reply] = []
    begin = at = 0
    code = b""
    texts: list[bytes] = []
    while (end := buffer.find(b"\n", at)) >= 0:
        if end + 1 - at > MAX_REPLY_LINE:
            raise ValueError("a reply line is too long")
        line = buffer[at : end - 1 if buffer[end - 1 : end] == b"\r" else end]
        at = end + 1
        separator = line[3:4]
        if (
            len(line) < 3
            or line[0] not in b"2345"
            or line[1] not in _CODE_DIGITS
            or line[2] not in _CODE_DIGITS
            or separator not in (b" ", b"-", b"")
            or (texts and line[:3] != code)
        ):
            raise ValueError("not a reply line")
        code = line[:3]
        texts.append(line[4:])
        if separator != b"-":
            text = b"\n".join(texts).decode("utf-8", "replace")
            replies.append(Reply(int(code), text))
            texts = []
            begin = at
    if len(buffer) - at > MAX_REPLY_LINE or at - begin > MAX_REPLY:
        raise ValueError("a reply is too long")
    return replies, buffer[begin:]


def data_lines(message: bytes) -> bytes:
    """`message` in wire form (CRLF line ends, a final CRLF) as DATA sends it: a line that
    starts with a dot gets a second one (RFC 5321, 4.5.2), and the end-of-data line follows."""
    if not message.endswith(b"\r\n"):
        raise ValueError("the message does not end with a line end")
    if message[:1] == b".":
        message = b"." + message
    if b"\n." in message:
        message = message.replace(b"\n.", b"\n..")
    return message + b".\r\n"


def _nothing_to_check() -> None:
    return None


# What the server's 354 settles a gated transaction's envelope with: the message waits.
_AT_DATA = Reply(354, "waiting for the gate")


class SmtpWire(asyncio.Protocol):
    """One established SMTP connection: its transactions and single commands, one at a time."""

    def __init__(
        self, transport: asyncio.Transport, *, timeout: float, pipelining: bool, size: bool
    ) -> None:
        self.pipelining = pipelining
        self.announces_size = size
        self.message_sent = False
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self.timeout = timeout
        self._reply_timeout = timeout
        self._buffer = b""
        self._awaiting: deque[str] = deque()
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._outcome: asyncio.Future[Reply] | None = None
        self._final: Reply | None = None
        self._refusal: Refused | None = None
        self._recipient = b""
        self._message = b""
        self._before_message: Callable[[], None] = _nothing_to_check
        self._gated = False
        self._broken = False
        self.closed: asyncio.Future[None] = self._loop.create_future()

    @classmethod
    def take_over(
        cls, transport: asyncio.Transport, *, timeout: float, pipelining: bool, size: bool
    ) -> SmtpWire:
        """The protocol of `transport` from now on (its previous one hears nothing more)."""
        wire = cls(transport, timeout=timeout, pipelining=pipelining, size=size)
        transport.set_protocol(wire)
        return wire

    @property
    def is_open(self) -> bool:
        """Whether the connection can take a command: neither closed nor holding the start of
        a reply nobody asked for."""
        return not (self._broken or self._buffer or self._transport.is_closing())

    def close(self) -> None:
        self._broken = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._transport.is_closing():
            self._transport.close()

    async def transaction(
        self,
        mail_from: bytes,
        recipient: bytes,
        message: bytes,
        before_message: Callable[[], None] = _nothing_to_check,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> Reply:
        """Send `message` from `mail_from` to `recipient` (addresses as the command line
        writes them, without brackets); the server's reply to the message, whatever it is.

        Raises `Refused` when the server refused MAIL, RCPT or DATA (the envelope is then
        open: RSET it), `WireError` when the connection broke, timed out or said something
        unreadable (it is then closed), or whatever `gate` or `before_message` raised (closed
        too). `gate` is awaited after the 354, before `before_message` and the message.
        """
        size = b" SIZE=%d" % len(message) if self.announces_size else b""
        mail = b"MAIL FROM:<%s>%s\r\n" % (mail_from, size)
        rcpt = b"RCPT TO:<%s>\r\n" % recipient
        body = data_lines(message)
        self._message = body
        self._before_message = before_message
        self._gated = gate is not None
        try:
            if self.pipelining:
                self._recipient = b""
                reply = await self._exchange(mail + rcpt + b"DATA\r\n", (MAIL, RCPT, DATA))
            else:
                self._recipient = rcpt
                reply = await self._exchange(mail, (MAIL,))
        finally:
            self._gated = False
        if gate is None or reply is not _AT_DATA:
            return reply
        # The server waits for the message: the last check before its first byte.
        try:
            await gate()
        except BaseException:
            self.close()
            raise
        self._message = body
        self._before_message = before_message
        return await self._exchange(b"", (), message=True)

    async def command(self, line: bytes, timeout: float | None = None) -> Reply:  # noqa: ASYNC109
        """One command (`RSET`, `NOOP`, `QUIT`, without its line end) and its reply."""
        return await self._exchange(line + b"\r\n", (_COMMAND,), timeout)

    async def _exchange(
        self,
        data: bytes,
        steps: tuple[str, ...],
        timeout: float | None = None,  # noqa: ASYNC109
        *,
        message: bool = False,
    ) -> Reply:
        """Write `data` (or, with `message`, the transaction's message) and await the reply
        that ends the exchange."""
        if self._outcome is not None:
            raise RuntimeError("the connection is already in a transaction")
        self.message_sent = False
        self._final = None
        self._refusal = None
        self._reply_timeout = self.timeout if timeout is None else timeout
        outcome: asyncio.Future[Reply] = self._loop.create_future()
        self._outcome = outcome
        try:
            if self._buffer:  # the start of a reply nobody asked for
                self.close()
            if message:
                self._write_message()
            else:
                self._write(data, steps)
            return await outcome
        except asyncio.CancelledError:
            self.close()  # where the conversation stands is no longer known
            raise
        finally:
            self._outcome = None
            self._message = b""
            self._before_message = _nothing_to_check

    def _write(self, data: bytes, steps: tuple[str, ...]) -> bool:
        """Write `data`, whose replies are those to `steps`; False if the connection is gone."""
        if self._broken or self._transport.is_closing():
            self._fail(ConnectionLost("the connection is closed", message_sent=self.message_sent))
            return False
        self._awaiting.extend(steps)
        self._transport.write(data)
        self._deadline = self._loop.time() + self._reply_timeout
        if self._timer is None or self._timer.when() > self._deadline:  # a shorter timeout
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._deadline, self._on_timer)
        return True

    def _on_timer(self) -> None:
        # One timer per connection, armed at the first deadline and moved on only when it
        # fires: a timer per command would cost more than the rest of the exchange.
        self._timer = None
        if not self._awaiting:
            return  # idle: the next command arms it again
        if self._loop.time() < self._deadline:  # replies came since; the awaited one has time
            self._timer = self._loop.call_at(self._deadline, self._on_timer)
            return
        self._fail(ReplyTimeout("no reply in time", message_sent=self.message_sent))

    # -- asyncio.Protocol ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
        try:
            replies, self._buffer = parse_replies(data)
        except ValueError:
            self._fail(UnreadableReply("an unreadable reply", message_sent=self.message_sent))
            return
        if not replies:
            return
        if len(replies) > len(self._awaiting):
            self._fail(UnreadableReply("a reply to nothing", message_sent=self.message_sent))
            return
        self._deadline = self._loop.time() + self._reply_timeout
        for reply in replies:
            if self._broken:
                return
            self._on_reply(self._awaiting.popleft(), reply)
        if not self._awaiting:
            self._settle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionLost("the connection was lost", message_sent=self.message_sent))
        if not self.closed.done():
            self.closed.set_result(None)

    # -- the transaction -----------------------------------------------------------------

    def _on_reply(self, step: str, reply: Reply) -> None:
        if step is MAIL:
            if reply.code != 250:
                self._refuse(step, reply)
            elif self._recipient:
                self._write(self._recipient, (RCPT,))
        elif step is RCPT:
            if reply.code not in (250, 251):
                self._refuse(step, reply)
            elif not self.pipelining:
                self._write(b"DATA\r\n", (DATA,))
        elif step is DATA:
            if reply.code != 354:
                self._refuse(step, reply)
            elif self._refusal is not None:
                self._write(b".\r\n", (_DOT,))
            elif self._gated:
                self._final = _AT_DATA
            else:
                self._write_message()
        elif step is not _DOT:  # the message's reply, or a single command's
            self._final = reply

    def _refuse(self, step: str, reply: Reply) -> None:
        if self._refusal is None:
            self._refusal = Refused(step, reply)

    def _write_message(self) -> None:
        try:
            self._before_message()
        except Exception as exc:  # the check's verdict, raised to the sender
            self._fail(exc)
            return
        if self._write(self._message, (_MESSAGE,)):
            self.message_sent = True

    def _settle(self) -> None:
        outcome = self._outcome
        if outcome is None or outcome.done():
            return
        if self._refusal is not None:
            outcome.set_exception(self._refusal)
        elif self._final is not None:
            outcome.set_result(self._final)
        else:  # every reply came and none of them ended the exchange
            self._fail(UnreadableReply("no reply ended it", message_sent=self.message_sent))

    def _fail(self, exc: BaseException) -> None:
        """End the connection; the transaction waiting on it, if any, raises `exc`."""
        self._awaiting.clear()
        self._buffer = b""
        self.close()
        outcome = self._outcome
        if outcome is not None and not outcome.done():
            outcome.set_exception(exc)
