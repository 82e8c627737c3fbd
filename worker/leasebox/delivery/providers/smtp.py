"""Delivering over SMTP with a Message-ID that survives retries.

The worker runs many sends at once, so the provider keeps a small pool of authenticated
connections (`pool_size`, default 8) instead of paying connect + EHLO + STARTTLS + AUTH per
message. aiosmtplib opens each connection; the mail transactions on it are spoken by
`smtp_wire`, lean enough for thousands of messages a second, and pipelined when the server
offers PIPELINING. Replies map onto the worker's outcomes: 4xx, timeouts and connection
failures are transient, 5xx permanent. Failing to *connect* during a send is always
transient, because a rotated password or a broken certificate is not the message's fault and
must not dead-letter the queue.

Where a connection breaks decides what may happen next. Before the message's first byte (an
idle connection the server closed, found out at MAIL FROM) nothing was sent, so the message
is tried once more on a fresh connection. Once the message is on its way (after the 354 that
answers DATA), the server may hold all of it: a connection lost (or a reply that never came
or cannot be read) then is *ambiguous*, `AmbiguousProviderError`, and the message is never
sent again within this attempt; the worker's next attempt carries the same Message-ID, by
which receiving systems drop a duplicate. A refused step resets the envelope (RSET), so that
the pooled connection serves the next message.

Waiting for a free connection is bounded by the timeout, and the message's expiry is checked
after every wait: once the connection is ours, before the envelope, and again right before
the message's first byte (after the replies to MAIL, RCPT and DATA). An OTP that expired
meanwhile is never written to the wire. A message with a replacement key is also checked in
the database at that last point, after the 354 (the server waits meanwhile): one that a newer
message of its key replaced ends `superseded` without a byte of it sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from email.headerregistry import Address
from email.utils import parseaddr
from functools import lru_cache
from typing import cast

import aiosmtplib

from leasebox.addresses import ascii_domain
from leasebox.config import PROVIDER_TIMEOUT
from leasebox.delivery.providers.base import (
    Email,
    SendResult,
    Slots,
    derived_message_id,
    one_line,
    sender_domain,
)
from leasebox.delivery.providers.mime import build_mime
from leasebox.delivery.providers.smtp_wire import (
    RCPT,
    ConnectionLost,
    Refused,
    ReplyTimeout,
    SmtpWire,
    WireError,
)
from leasebox.delivery.providers.urls import (
    TIMEOUT,
    ProviderUrl,
    UrlOption,
    option_names,
    parse_provider_url,
)
from leasebox.errors import (
    AmbiguousProviderError,
    ConfigurationError,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)

DEFAULT_SENDER = "leasebox@localhost"
DEFAULT_POOL_SIZE = 8
URL_OPTIONS = (
    UrlOption(
        "from",
        f"`{DEFAULT_SENDER}`",
        "the sender, `address` or `Name <address>` (percent-encoded: `no-reply%40example.com`); "
        "its domain is the right side of every Message-ID",
    ),
    UrlOption(
        "starttls",
        "`auto`",
        "`auto` upgrades when the server offers STARTTLS, `true` refuses a server that does "
        "not, `false` never upgrades (`smtp://` only; `smtps://` is TLS from the start)",
    ),
    UrlOption(
        "tls_verify", "`true`", "check the server's certificate and name; `false` for tests only"
    ),
    TIMEOUT,
    UrlOption(
        "pool_size",
        f"`{DEFAULT_POOL_SIZE}`",
        "authenticated connections kept open and used at once",
    ),
)
_CONNECTION_ERRORS = (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPConnectError, OSError)


class _Disconnected(Exception):
    """The connection broke before the message's first byte: nothing of it was sent."""


@dataclass(frozen=True)
class SmtpSettings:
    """Where and how to connect; `starttls=None` upgrades whenever the server offers it."""

    host: str
    port: int = 25
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    implicit_tls: bool = False
    starttls: bool | None = None
    tls_verify: bool = True
    sender: str = DEFAULT_SENDER
    timeout: float = PROVIDER_TIMEOUT.default
    pool_size: int = DEFAULT_POOL_SIZE

    @property
    def target(self) -> str:
        return f"{'smtps' if self.implicit_tls else 'smtp'}://{self.host}:{self.port}"

    @property
    def envelope_sender(self) -> str:
        return _envelope_sender(self.sender)

    @property
    def message_id_domain(self) -> str:
        """The sender's domain: the right side of every Message-ID this provider writes."""
        return sender_domain(self.sender)


@lru_cache(maxsize=16)
def _envelope_sender(sender: str) -> str:
    return parseaddr(sender)[1]


def wire_address(address: str) -> str:
    """`address` as SMTP writes it: as given, except that an internationalised domain is in
    its ASCII (IDNA) form, the same mailbox for every server, SMTPUTF8 or not."""
    local, at, domain = address.rpartition("@")
    if not at or domain.isascii():
        return address
    try:
        return f"{local}@{ascii_domain(domain)}"
    except ValueError:
        return address  # refused later, as an address that cannot be sent


def mailbox(address: str) -> bytes:
    """`address` as MAIL FROM or RCPT TO carries it (within the brackets); ValueError for an
    address that such a line cannot hold: not printable ASCII, a space or a bracket."""
    if not (address and address.isascii() and address.isprintable()) or (
        " " in address or "<" in address or ">" in address
    ):
        raise ValueError("the address cannot be written on an SMTP command line")
    return address.encode("ascii")


class SmtpProvider:
    """A pooled SMTP client; one instance serves every concurrent send of a worker."""

    name = "smtp"
    # Message-ID is derived from the delivery key, but relays do not drop repeats by it.
    idempotent = False

    def __init__(self, settings: SmtpSettings) -> None:
        self.settings = settings
        self._idle: list[SmtpWire] = []
        self._slots = Slots(settings.pool_size, settings.timeout, f"SMTP server {settings.target}")
        self._closed = False

    def __repr__(self) -> str:
        return f"SmtpProvider({self.settings.target}, pool_size={self.settings.pool_size})"

    async def start(self) -> None:
        """Connect once (EHLO, STARTTLS, AUTH) so that bad settings fail before any claim."""
        self._closed = False
        self._idle.append(await self._connect(during_send=False))

    async def send(self, email: Email) -> SendResult:
        if self._closed:
            raise TransientProviderError("closed", "the SMTP provider is closed")
        # The address on the wire and the Message-ID serve both the message and its envelope.
        recipient = wire_address(email.recipient)
        message_id = derived_message_id(email.delivery_key, self.settings.message_id_domain)
        try:
            message = build_mime(
                email, self.settings.sender, recipient=recipient, message_id=message_id
            )
        except (ValueError, TypeError):
            raise PermanentProviderError(
                "invalid_message",
                "cannot build the message: the recipient or subject is not a valid header",
            ) from None
        try:
            envelope = (mailbox(self.settings.envelope_sender), mailbox(recipient))
        except ValueError:
            raise PermanentProviderError(
                "invalid_address", "the sender or recipient cannot be sent over SMTP"
            ) from None
        await self._slots.acquire()
        try:
            wire = self._take_idle()
            if wire is not None:
                try:
                    await self._transmit(wire, email, envelope, message)
                    return SendResult(provider_message_id=message_id)
                except _Disconnected:
                    pass  # dropped while idle, before the message: nothing was sent, one fresh try
                finally:
                    self._give_back(wire)
            email.raise_if_expired()
            wire = await self._connect(during_send=True)
            try:
                await self._transmit(wire, email, envelope, message)
            except _Disconnected as exc:
                raise TransientProviderError(
                    "connection", self._describe(exc.__cause__ or exc, "dropped the connection")
                ) from None
            finally:
                self._give_back(wire)
        finally:
            self._slots.release()
        return SendResult(provider_message_id=message_id)

    async def check(self) -> str | None:
        if self._closed:
            return "the SMTP provider is closed"
        if self._slots.locked():
            return None  # every connection is busy sending, which is as alive as it gets
        await self._slots.acquire()  # a free slot: taken at once
        try:
            wire = self._take_idle()
            if wire is None:
                wire = await self._connect(during_send=False)
            reply = await wire.command(b"NOOP")
        except ProviderError as exc:
            return str(exc)
        except WireError as exc:
            return self._describe(exc, "NOOP failed")
        finally:
            self._slots.release()
        if reply.code != 250:
            wire.close()
            return self._describe_reply(reply.code, reply.text, "refused NOOP")
        self._give_back(wire)
        return None

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        grace = min(self.settings.timeout, 2.0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for wire in idle:
            with contextlib.suppress(WireError):
                await wire.command(b"QUIT", timeout=max(deadline - loop.time(), 0.001))
            wire.close()
        # A TLS connection closes only after its close_notify exchange; wait for it so that
        # no socket outlives the provider (bounded, as a peer may never answer).
        pending = [wire.closed for wire in idle if not wire.closed.done()]
        if pending:
            await asyncio.wait(pending, timeout=max(deadline - loop.time(), 0.05))

    def _take_idle(self) -> SmtpWire | None:
        while self._idle:
            wire = self._idle.pop()
            if wire.is_open:
                return wire
            wire.close()
        return None

    def _give_back(self, wire: SmtpWire) -> None:
        if self._closed or not wire.is_open:
            wire.close()
        else:
            self._idle.append(wire)

    async def _transmit(
        self, wire: SmtpWire, email: Email, envelope: tuple[bytes, bytes], message: bytes
    ) -> None:
        email.raise_if_expired()  # the connection is ours: nothing of the message is out yet
        # A message that a newer one may replace is checked in the database at the 354, right
        # before its first byte; any other goes out at once.
        gate = email.raise_if_stale if email.superseded is not None else None
        try:
            reply = await wire.transaction(*envelope, message, email.raise_if_expired, gate)
        except Refused as refused:
            await self._reset(wire)
            what = "refused the recipient" if refused.step is RCPT else "rejected the message"
            raise self._reply_error(refused.reply.code, refused.reply.text, email, what) from None
        except ConnectionLost as exc:
            if exc.message_sent:
                raise AmbiguousProviderError(
                    f"SMTP server {self.settings.target} dropped the connection after the "
                    "message was sent, before confirming it; it may have been accepted "
                    "(retried later with the same Message-ID)"
                ) from None
            raise _Disconnected() from exc
        except ReplyTimeout as exc:
            if exc.message_sent:
                raise AmbiguousProviderError(
                    f"SMTP server {self.settings.target} did not confirm the message in time; "
                    "it may have been accepted (retried later with the same Message-ID)"
                ) from None
            raise TransientProviderError(
                "timeout", f"SMTP server {self.settings.target} did not answer in time"
            ) from None
        except WireError as exc:  # a reply that cannot be read: the connection is closed
            if exc.message_sent:
                raise AmbiguousProviderError(
                    f"SMTP server {self.settings.target} answered the message with a reply "
                    "that cannot be read; it may have been accepted (retried later with "
                    "the same Message-ID)"
                ) from None
            raise TransientProviderError(
                "smtp_invalid_reply",
                f"SMTP server {self.settings.target} sent a reply that cannot be read",
            ) from None
        if reply.code != 250:  # the transaction is over, refused: nothing to reset
            raise self._reply_error(reply.code, reply.text, email, "rejected the message")

    async def _reset(self, wire: SmtpWire) -> None:
        """End the open envelope (MAIL, RCPT) so that the connection serves the next send."""
        try:
            reply = await wire.command(b"RSET")
        except WireError:
            return  # closed already
        if reply.code != 250:
            wire.close()

    def _reply_error(self, code: int, reply: str, email: Email | None, what: str) -> ProviderError:
        message = self._describe_reply(code, reply, what, email)
        if 500 <= code < 600:
            return PermanentProviderError(f"smtp_{code}", message)
        return TransientProviderError(f"smtp_{code}", message)

    def _describe_reply(self, code: int, reply: str, what: str, email: Email | None = None) -> str:
        text = one_line(reply, hide=self._hidden(email), limit=160)
        return f"SMTP server {self.settings.target} {what}: {code} {text}".rstrip()

    async def _connect(self, *, during_send: bool) -> SmtpWire:
        settings = self.settings
        client = aiosmtplib.SMTP(
            hostname=settings.host,
            port=settings.port,
            username=settings.username,
            password=settings.password,
            use_tls=settings.implicit_tls,
            start_tls=False if settings.implicit_tls else settings.starttls,
            validate_certs=settings.tls_verify,
            timeout=settings.timeout,
        )
        try:
            await client.connect()
            if client.is_ehlo_or_helo_needed:  # a plain session without AUTH has not greeted
                await _greet(client)
            transport = client.transport
            # Not an isinstance check: uvloop's transports are transports without
            # subclassing asyncio's, and they would all look closed.
            if transport is None or transport.is_closing():
                raise aiosmtplib.SMTPServerDisconnected("the connection closed on its own")
        except Exception as exc:
            client.close()
            error = self._connect_error(exc)
            if during_send and not error.transient:
                raise TransientProviderError(error.code, str(error)) from None
            raise error from None
        return SmtpWire.take_over(
            cast("asyncio.Transport", transport),
            timeout=settings.timeout,
            pipelining=client.supports_extension("pipelining"),
            size=client.supports_extension("size"),
        )

    def _connect_error(self, exc: Exception) -> ProviderError:
        target = self.settings.target
        if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
            user = self.settings.username or ""
            return PermanentProviderError(
                "smtp_auth",
                f"SMTP server {target} rejected the credentials of user {user!r} "
                f"({exc.code} {one_line(exc.message, hide=self._hidden(), limit=120)})",
            )
        if isinstance(exc, aiosmtplib.SMTPTimeoutError | TimeoutError):
            return TransientProviderError("timeout", f"SMTP server {target} timed out on connect")
        tls_failure = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
        if isinstance(tls_failure, ssl.SSLError):
            reason = getattr(tls_failure, "verify_message", None) or tls_failure.reason
            return PermanentProviderError(
                "tls", f"TLS with SMTP server {target} failed: {reason or 'handshake error'}"
            )
        if isinstance(exc, aiosmtplib.SMTPResponseException):
            return self._reply_error(exc.code, exc.message, None, "refused the session")
        if isinstance(exc, _CONNECTION_ERRORS):
            return TransientProviderError("connection", self._describe(exc, "is unreachable"))
        if isinstance(exc, aiosmtplib.SMTPException):
            # Missing AUTH or STARTTLS support: a setting to change, not a thing to wait for.
            return PermanentProviderError("smtp_setup", self._describe(exc, "cannot be used"))
        return TransientProviderError("connection", self._describe(exc, "failed on connect"))

    def _hidden(self, email: Email | None = None) -> list[str]:
        hidden = [self.settings.password or ""]
        if email is not None:
            hidden.append(email.recipient)
        return hidden

    def _describe(self, exc: BaseException, what: str, email: Email | None = None) -> str:
        detail = one_line(str(exc), hide=self._hidden(email), limit=160) or type(exc).__name__
        return f"SMTP server {self.settings.target} {what}: {detail}"


async def _greet(client: aiosmtplib.SMTP) -> None:
    """EHLO, or HELO for a server that does not know EHLO (as aiosmtplib would before MAIL)."""
    try:
        await client.ehlo()
    except aiosmtplib.SMTPHeloError:
        if not client.is_connected:
            raise
        await client.helo()


def _sender(value: str) -> str:
    _, address = parseaddr(value)
    try:
        Address(addr_spec=address)
    except (ValueError, IndexError):
        address = ""
    if "@" not in address:
        raise ConfigurationError(
            "smtp:// provider URL option 'from' must be an address such as "
            "no-reply@example.com or 'Example <no-reply@example.com>'"
        )
    return value


def settings_from_url(parsed: ProviderUrl, timeout: float) -> SmtpSettings:
    """SmtpSettings from a parsed `smtp://` or `smtps://` URL."""
    parsed.reject_unknown_options(option_names(URL_OPTIONS))
    scheme = parsed.scheme
    if not parsed.host:
        raise ConfigurationError(f"{scheme}:// provider URL needs a host, e.g. {scheme}://mail:25")
    if parsed.path not in ("", "/"):
        raise ConfigurationError(f"{scheme}:// provider URL must not have a path")
    if parsed.password is not None and not parsed.username:
        raise ConfigurationError(f"{scheme}:// provider URL has a password but no user name")
    implicit_tls = scheme == "smtps"
    raw_starttls = parsed.options.get("starttls", "auto").lower()
    starttls = None if raw_starttls == "auto" else parsed.bool_option("starttls", False)
    if implicit_tls and starttls:
        raise ConfigurationError("smtps:// already uses TLS; starttls=true applies to smtp://")
    return SmtpSettings(
        host=parsed.host,
        port=parsed.port or (465 if implicit_tls else 25),
        username=parsed.username,
        password=parsed.password,
        implicit_tls=implicit_tls,
        starttls=starttls,
        tls_verify=parsed.bool_option("tls_verify", True),
        sender=_sender(parsed.options.get("from", DEFAULT_SENDER)),
        timeout=parsed.float_option("timeout", timeout),
        pool_size=parsed.int_option("pool_size", DEFAULT_POOL_SIZE),
    )


def smtp_provider_from_url(url: str, timeout: float) -> SmtpProvider:
    """The `smtp://` / `smtps://` factory used by `provider_from_url`."""
    return SmtpProvider(settings_from_url(parse_provider_url(url), timeout))
