"""Delivering over SMTP with a Message-ID that survives retries.

The worker runs many sends at once, so the provider keeps a small pool of authenticated
connections (`pool_size`, default 8) instead of paying connect + EHLO + STARTTLS + AUTH per
message. Replies map onto the worker's outcomes: 4xx, timeouts and connection failures are
transient, 5xx permanent. Failing to *connect* during a send is always transient, because a
rotated password or a broken certificate is not the message's fault and must not
dead-letter the queue.

Where a connection breaks decides what may happen next. Before DATA (an idle connection the
server closed, found out at MAIL FROM) nothing was sent, so the message is tried once more on
a fresh connection. From DATA on, the server may hold the whole message: a connection lost
(or a reply that never came) then is *ambiguous*, `AmbiguousProviderError`, and the message
is never sent again within this attempt; the worker's next attempt carries the same
Message-ID, by which receiving systems drop a duplicate.

Waiting for a free connection is bounded by the timeout, and the message's expiry is checked
again right before DATA, after every wait (for the pool, the connection, the envelope): an
OTP that expired meanwhile is never written to the wire.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from email.headerregistry import Address
from email.utils import parseaddr
from functools import lru_cache

import aiosmtplib
from aiosmtplib.typing import Default

from leasebox.delivery.providers.base import (
    Email,
    SendResult,
    acquire_slot,
    derived_message_id,
    one_line,
)
from leasebox.delivery.providers.mime import build_mime
from leasebox.delivery.providers.urls import ProviderUrl, parse_provider_url
from leasebox.errors import (
    AmbiguousProviderError,
    ConfigurationError,
    MessageExpired,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from leasebox.messages import ascii_domain

DEFAULT_SENDER = "leasebox@localhost"
DEFAULT_POOL_SIZE = 8
URL_OPTIONS = ("from", "pool_size", "starttls", "timeout", "tls_verify")
_CONNECTION_ERRORS = (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPConnectError, OSError)


class _Disconnected(Exception):
    """The connection broke before DATA: nothing of the message was sent."""


def _nothing_to_check() -> None:
    return None


async def _reset(client: aiosmtplib.SMTP) -> None:
    """End the open envelope (MAIL, RCPT) so that the connection serves the next send."""
    try:
        await client.rset()
    except (aiosmtplib.SMTPException, OSError):
        client.close()


class _Client(aiosmtplib.SMTP):
    """aiosmtplib's client, knowing whether the message itself has begun (DATA was sent).

    `before_data` runs right before DATA: the last moment at which not sending is certain.
    """

    data_started = False
    before_data: Callable[[], None] = staticmethod(_nothing_to_check)

    async def transaction(self, sender: str, recipient: str, message: bytes) -> None:
        """One mail transaction (MAIL, RCPT, DATA) for one recipient, the envelope reset
        when the server refuses any step.

        `sendmail` does the same for any message, at a cost per message that a worker
        sending thousands a second notices: it parses both addresses twice and, to announce
        the size, converts the whole message's line ends once more than DATA does. Here
        the message is already in its wire form (`build_mime`: CRLF line ends, a final
        CRLF), so its size is its length, and each address is parsed once, by MAIL or RCPT,
        which also refuse one that cannot be written on a command line.
        """
        options = [f"SIZE={len(message)}"] if self.supports_extension("size") else []
        try:
            await self.mail(sender, options=options)
            await self.rcpt(recipient)
            await self.data(message)
        except aiosmtplib.SMTPResponseException as exc:
            if self.is_connected and 200 <= exc.code < 600:
                await _reset(self)
            raise

    async def data(
        self,
        message: str | bytes,
        /,
        *,
        timeout: float | Default | None = Default.token,  # noqa: ASYNC109 - aiosmtplib's own
    ) -> aiosmtplib.SMTPResponse:
        self.before_data()
        self.data_started = True
        return await super().data(message, timeout=timeout)


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
    timeout: float = 10.0
    pool_size: int = DEFAULT_POOL_SIZE

    @property
    def target(self) -> str:
        return f"{'smtps' if self.implicit_tls else 'smtp'}://{self.host}:{self.port}"

    @property
    def envelope_sender(self) -> str:
        return _envelope_sender(self.sender)


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


class SmtpProvider:
    """A pooled SMTP client; one instance serves every concurrent send of a worker."""

    name = "smtp"
    # Message-ID is derived from the delivery key, but relays do not drop repeats by it.
    idempotent = False

    def __init__(self, settings: SmtpSettings) -> None:
        self.settings = settings
        self._idle: list[_Client] = []
        self._slots = asyncio.Semaphore(settings.pool_size)
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
        message_id = derived_message_id(email.delivery_key)
        try:
            message = build_mime(
                email, self.settings.sender, recipient=recipient, message_id=message_id
            )
        except (ValueError, TypeError):
            raise PermanentProviderError(
                "invalid_message",
                "cannot build the message: the recipient or subject is not a valid header",
            ) from None
        await acquire_slot(
            self._slots, self.settings.timeout, f"SMTP server {self.settings.target}"
        )
        try:
            client = self._take_idle()
            if client is not None:
                try:
                    await self._transmit(client, email, recipient, message)
                    return SendResult(provider_message_id=message_id)
                except _Disconnected:
                    pass  # dropped while idle, before DATA: nothing was sent, one fresh try
                finally:
                    self._give_back(client)
            email.raise_if_expired()
            client = await self._connect(during_send=True)
            try:
                await self._transmit(client, email, recipient, message)
            except _Disconnected as exc:
                raise TransientProviderError(
                    "connection", self._describe(exc.__cause__ or exc, "dropped the connection")
                ) from None
            finally:
                self._give_back(client)
        finally:
            self._slots.release()
        return SendResult(provider_message_id=message_id)

    async def check(self) -> str | None:
        if self._closed:
            return "the SMTP provider is closed"
        if self._slots.locked():
            return None  # every connection is busy sending, which is as alive as it gets
        async with self._slots:
            client = self._take_idle()
            try:
                if client is None:
                    client = await self._connect(during_send=False)
                await client.noop()
            except ProviderError as exc:
                return str(exc)
            except (aiosmtplib.SMTPException, OSError) as exc:
                if client is not None:
                    client.close()
                return self._describe(exc, "NOOP failed")
            self._give_back(client)
        return None

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        grace = min(self.settings.timeout, 2.0)
        protocols = [client.protocol for client in idle if client.protocol is not None]
        for client in idle:
            try:
                await client.quit(timeout=grace)
            except (aiosmtplib.SMTPException, OSError):
                client.close()
        # A TLS connection closes only after its close_notify exchange; wait for it so that
        # no socket outlives the provider (bounded, as a peer may never answer).
        deadline = asyncio.get_running_loop().time() + grace
        while any(p.transport is not None for p in protocols):
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.005)

    def _take_idle(self) -> _Client | None:
        while self._idle:
            client = self._idle.pop()
            if client.is_connected:
                return client
            client.close()
        return None

    def _give_back(self, client: _Client) -> None:
        if self._closed or not client.is_connected:
            client.close()
        else:
            self._idle.append(client)

    async def _transmit(
        self, client: _Client, email: Email, recipient: str, message: bytes
    ) -> None:
        client.data_started = False
        client.before_data = email.raise_if_expired
        try:
            await client.transaction(self.settings.envelope_sender, recipient, message)
        except MessageExpired:
            await _reset(client)
            raise
        except aiosmtplib.SMTPTimeoutError:
            client.close()
            if client.data_started:
                raise AmbiguousProviderError(
                    f"SMTP server {self.settings.target} did not confirm the message in time; "
                    "it may have been accepted (retried later with the same Message-ID)"
                ) from None
            raise TransientProviderError(
                "timeout", f"SMTP server {self.settings.target} did not answer in time"
            ) from None
        except _CONNECTION_ERRORS as exc:
            client.close()
            if client.data_started:
                raise AmbiguousProviderError(
                    f"SMTP server {self.settings.target} dropped the connection after the "
                    "message was sent, before confirming it; it may have been accepted "
                    "(retried later with the same Message-ID)"
                ) from None
            raise _Disconnected() from exc
        except aiosmtplib.SMTPRecipientRefused as exc:
            raise self._reply_error(exc.code, exc.message, email, "refused the recipient") from None
        except aiosmtplib.SMTPNotSupported as exc:
            raise PermanentProviderError(
                "smtp_unsupported", self._describe(exc, "cannot take this message", email)
            ) from None
        except aiosmtplib.SMTPResponseException as exc:
            if not 200 <= exc.code < 600:  # a reply that could not be read at all
                client.close()
                if client.data_started:
                    raise AmbiguousProviderError(
                        f"SMTP server {self.settings.target} answered the message with a reply "
                        "that cannot be read; it may have been accepted (retried later with "
                        "the same Message-ID)"
                    ) from None
                raise TransientProviderError(
                    "smtp_invalid_reply",
                    f"SMTP server {self.settings.target} sent a reply that cannot be read",
                ) from None
            raise self._reply_error(exc.code, exc.message, email, "rejected the message") from None
        except aiosmtplib.SMTPException as exc:
            client.close()
            raise TransientProviderError(
                "smtp_error", self._describe(exc, "failed", email)
            ) from None
        except ValueError:
            raise PermanentProviderError(
                "invalid_address", "the recipient address cannot be sent over SMTP"
            ) from None
        finally:
            client.before_data = _nothing_to_check

    def _reply_error(self, code: int, reply: str, email: Email | None, what: str) -> ProviderError:
        text = one_line(reply, hide=self._hidden(email), limit=160)
        message = f"SMTP server {self.settings.target} {what}: {code} {text}".rstrip()
        if 500 <= code < 600:
            return PermanentProviderError(f"smtp_{code}", message)
        return TransientProviderError(f"smtp_{code}", message)

    async def _connect(self, *, during_send: bool) -> _Client:
        settings = self.settings
        client = _Client(
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
        except Exception as exc:
            client.close()
            error = self._connect_error(exc)
            if during_send and not error.transient:
                raise TransientProviderError(error.code, str(error)) from None
            raise error from None
        return client

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
    parsed.reject_unknown_options(URL_OPTIONS)
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
