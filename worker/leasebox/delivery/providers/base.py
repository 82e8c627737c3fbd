"""The contract between the worker and a mail provider, and the helpers every provider shares.

The worker knows nothing about SMTP or HTTP: it hands an `Email` to a `Provider` and learns
either a `SendResult` or a `ProviderError` whose `permanence` decides between a retry with
backoff (`transient`) and a dead letter (`permanent`). Error messages end up in logs and in the
outbox's `last_error`, so everything here that builds one keeps bodies, codes, passwords and
full recipient addresses out of it.

Two duties of every provider, built in or plugged in:

- **Never late, never replaced.** A provider that waits before it writes a message (for a
  pooled connection, a rate limit, a token) awaits `email.raise_if_stale()` after the wait
  and right before the first byte of the message goes out: an OTP past its `expires_at` then
  becomes a dead letter (`expired`) instead of a late code, and one whose replacement key
  has a newer message committed ends `superseded` instead of arriving beside the new code.
  A send that started before may finish. (`raise_if_expired()` is the synchronous half, for
  a callback that cannot wait; the worker itself checks both before it calls `send`.)
- **Say when it does not know.** When the whole message reached the provider and the answer
  was lost, raise `AmbiguousProviderError` and do not send it again yourself: the worker
  retries later with the same delivery key.

Whatever a provider returns or raises is untrusted text: the runtime sanitises and bounds it
(`leasebox.delivery.boundary`) before it reaches the database, a log line or a metric label.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parseaddr, parsedate_to_datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

from leasebox.errors import (
    PERMANENT,
    MessageExpired,
    MessageSuperseded,
    ProviderError,
    TransientProviderError,
)

MAX_ERROR_LENGTH = 240
# The right side of a derived Message-ID when the sender names no domain (the SMTP default
# sender is leasebox@localhost).
FALLBACK_MESSAGE_ID_DOMAIN = "localhost"


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Email:
    """One rendered message, ready for a provider; its text never shows in a repr.

    `expired()` says whether the message's `expires_at` has passed, on the clock the worker
    shares with the database. `superseded` is None for a message without a replacement key
    (nothing can replace it), else a check, in the database, of whether a newer message of
    its key has been committed. `raise_if_stale()` is what a provider awaits after a wait.
    """

    outbox_id: int
    kind: str
    aggregate_id: str | None
    delivery_key: str
    recipient: str = field(repr=False)
    subject: str = field(repr=False)
    text: str = field(repr=False)
    html: str | None = field(repr=False)
    attempt: int
    expired: Callable[[], bool] = field(default=_never, repr=False, compare=False)
    superseded: Callable[[], Awaitable[bool]] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def recipient_domain(self) -> str:
        """The part of the recipient after `@`, the most a log line may show of it."""
        return recipient_domain(self.recipient)

    def raise_if_expired(self) -> None:
        """`MessageExpired` if the message is past its expiry (the check that needs no wait)."""
        if self.expired():
            raise MessageExpired()

    async def raise_if_stale(self) -> None:
        """`MessageExpired` or `MessageSuperseded` if the message must no longer be written
        to the wire; a message without a replacement key costs no round trip."""
        self.raise_if_expired()
        if self.superseded is not None and await self.superseded():
            raise MessageSuperseded()


_new = object.__new__


def new_email(
    outbox_id: int,
    kind: str,
    aggregate_id: str | None,
    delivery_key: str,
    recipient: str,
    subject: str,
    text: str,
    html: str | None,
    attempt: int,
    expired: Callable[[], bool] = _never,
    superseded: Callable[[], Awaitable[bool]] | None = None,
) -> Email:
    """`Email(...)` as the worker builds one per send: the same value, made without the
    frozen dataclass's `object.__setattr__` per field, which costs a worker sending tens of
    thousands a second more than the rest of the send. Every field, in the class's order."""
    email: Email = _new(Email)
    email.__dict__.update(
        outbox_id=outbox_id,
        kind=kind,
        aggregate_id=aggregate_id,
        delivery_key=delivery_key,
        recipient=recipient,
        subject=subject,
        text=text,
        html=html,
        attempt=attempt,
        expired=expired,
        superseded=superseded,
    )
    return email


@dataclass(frozen=True)
class SendResult:
    """What the provider said when it accepted a message.

    `warning` is for an acceptance with a flaw worth a log line (a reply that could not be
    read, so no provider id); the message counts as sent either way.
    """

    provider_message_id: str | None
    warning: str | None = None


@runtime_checkable
class Provider(Protocol):
    """A way to deliver email; one instance serves all of a worker's concurrent sends."""

    name: str

    async def start(self) -> None:
        """Open and verify connections; raise `ProviderError` with a clear reason."""

    async def send(self, email: Email) -> SendResult:
        """Deliver one message or raise `ProviderError`."""

    async def check(self) -> str | None:
        """None when healthy, else a short reason (for readiness)."""

    async def close(self) -> None:
        """Release connections; safe to call twice or without `start`."""


def reads_content(provider: Provider) -> bool:
    """Whether `provider` reads subject and bodies (a provider may say `reads_content = False`).

    The worker renders templates and decrypts secrets only for providers that read them.
    """
    return bool(getattr(provider, "reads_content", True))


def recipient_domain(address: str) -> str:
    """The domain of an address (`example.com`), or `?` when it has none."""
    _, at, domain = address.rpartition("@")
    return domain.lower() if at and domain else "?"


def key_digest(delivery_key: str) -> str:
    """The hex digest that stands for a delivery key in headers (the Message-ID's left side,
    `X-Leasebox-Key`, tags): nothing about the aggregate leaks into them."""
    return hashlib.sha256(delivery_key.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=64)
def sender_domain(sender: str) -> str:
    """The domain of a sender (`Example <no-reply@Example.com>` -> `example.com`), in its
    lower-case ASCII form, or `localhost` when it has none: a Message-ID's right side."""
    _, at, domain = parseaddr(sender)[1].rpartition("@")
    try:
        ascii_form = domain.encode("idna").decode("ascii").lower() if at and domain else ""
    except UnicodeError:
        ascii_form = ""
    return ascii_form or FALLBACK_MESSAGE_ID_DOMAIN


def derived_message_id(delivery_key: str, domain: str = FALLBACK_MESSAGE_ID_DOMAIN) -> str:
    """A Message-ID that is the same on every retry of one logical send, on `domain` (the
    sender's: some filters score an id whose right side is not a domain).

    Mail systems that deduplicate by Message-ID then drop the duplicate that a lost lease can
    cause; the key itself is hashed so that nothing about the aggregate leaks into headers.
    """
    return f"<{key_digest(delivery_key)}@{domain}>"


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from an HTTP `Retry-After` header (delta-seconds or an HTTP-date), else None.

    A value that cannot be read, or a date in the past, is None: the caller's own backoff
    applies.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return seconds if seconds > 0 else None


_WHITESPACE = re.compile(r"\s+")
# Control characters (NUL included) and UTF-16 surrogates: unstorable in PostgreSQL text, or
# able to forge a line in a log; each is replaced by U+FFFD so that the damage shows.
_UNSAFE = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def safe_text(text: str) -> str:
    """`text` with every character that a database column or a log line must not hold
    replaced by U+FFFD (whitespace such as newlines is kept; `one_line` flattens it)."""
    return _UNSAFE.sub(REPLACEMENT, text)


def one_line(text: str, *, hide: Iterable[str] = (), limit: int = MAX_ERROR_LENGTH) -> str:
    """`text` as a single bounded, storable line with every value in `hide` masked.

    Used on replies from remote servers, which may quote a recipient or, from a careless
    server, a credential, and may hold anything at all: NUL bytes, lone surrogates, a
    megabyte of text. Only the start of a huge text is looked at.
    """
    flat = _WHITESPACE.sub(" ", safe_text(text[: limit * 16])).strip()
    for value in sorted((v for v in hide if v), key=len, reverse=True):
        flat = re.sub(re.escape(value), "***", flat, flags=re.IGNORECASE)
    if len(flat) > limit:
        flat = flat[: limit - 3].rstrip() + "..."
    return flat


class RequestOutcome(StrEnum):
    """What one provider request amounted to: the `outcome` label of the provider metrics.

    Few on purpose, so that a dashboard can tell an outage (`unavailable`, `timeout`,
    `connection`) from a bad batch of addresses (`rejected`) and from a problem with the
    account (`account`: credentials, a sender not verified, sending paused).
    """

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    THROTTLED = "throttled"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    ACCOUNT = "account"
    ERROR = "error"


_STATUS_SUFFIX = re.compile(r"_(\d{3})$")


def request_outcome(exc: BaseException | None) -> RequestOutcome:
    """The outcome of a send that returned (None) or raised `exc`.

    A `ProviderError` that names its outcome is taken at its word; otherwise the outcome is
    read from its class and code (`timeout`, `connection`, `*_auth`, a status suffix such as
    `http_429` or `smtp_421`), so that SMTP, the generic HTTP provider and plugins are
    counted too.
    """
    if exc is None:
        return RequestOutcome.ACCEPTED
    if isinstance(exc, ProviderError):
        named = getattr(exc, "outcome", None)
        if isinstance(named, str) and named in RequestOutcome._value2member_map_:
            return RequestOutcome(named)
        code = getattr(exc, "code", None)
        return _outcome_from_code(code if isinstance(code, str) else "", exc.permanence)
    if isinstance(exc, TimeoutError):
        return RequestOutcome.TIMEOUT
    if isinstance(exc, OSError):
        return RequestOutcome.CONNECTION
    return RequestOutcome.ERROR


def _outcome_from_code(code: str, permanence: object) -> RequestOutcome:
    if code in ("timeout", "pool_timeout"):
        return RequestOutcome.TIMEOUT
    if code in ("connection", "tls", "ambiguous"):
        return RequestOutcome.CONNECTION
    if code.endswith("_auth"):
        return RequestOutcome.ACCOUNT
    status = _STATUS_SUFFIX.search(code)
    number = int(status.group(1)) if status else 0
    if number == 429:
        return RequestOutcome.THROTTLED
    if code.startswith("http_") and number in (401, 403):
        return RequestOutcome.ACCOUNT
    if number == 421 or (code.startswith("http_") and number >= 500):
        return RequestOutcome.UNAVAILABLE
    if permanence == PERMANENT:
        return RequestOutcome.REJECTED
    return RequestOutcome.ERROR


def idempotency(provider: Provider) -> str:
    """Whether the provider's service drops a repeated send with the same delivery key.

    `"true"` or `"false"` when the provider says (`idempotent = True`), `"unknown"` when it
    does not: the generic HTTP provider sends an `Idempotency-Key` that the API behind it may
    or may not honour.
    """
    declared = getattr(provider, "idempotent", None)
    if declared is None:
        return "unknown"
    return "true" if declared else "false"


async def acquire_slot(slots: asyncio.Semaphore, within: float, target: str) -> None:
    """One of a provider's connection slots within `within` seconds, else a transient `pool_timeout`
    (nothing was sent): a saturated pool never holds a message past the provider timeout."""
    try:
        async with asyncio.timeout(within):
            await slots.acquire()
    except TimeoutError:
        raise TransientProviderError(
            "pool_timeout", f"no connection to {target} came free within {within:g}s"
        ) from None


class Slots:
    """A provider's connection slots, handed out in the order asked for, each wait bounded.

    What `acquire_slot` does around an `asyncio.Semaphore`, for a provider that sends
    thousands of messages a second through a saturated pool: there, a timeout per wait (a
    `Timeout`, a timer and its heap pushes) cost more than the rest of the wait. The waits
    here share one timer: they come in order and last as long, so the oldest deadline is the
    next, and the timer moves on to the next waiter's only when it fires.
    """

    def __init__(self, size: int, within: float, target: str) -> None:
        self._free = size
        self._within = within
        self._target = target
        self._waiters: deque[tuple[float, asyncio.Future[bool]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def locked(self) -> bool:
        """Whether every slot is taken."""
        return self._free == 0

    async def acquire(self) -> None:
        """A slot within `within` seconds, else a transient `pool_timeout` (nothing was sent):
        a saturated pool never holds a message past the provider timeout."""
        if self._free:
            self._free -= 1
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        deadline = loop.time() + self._within
        self._waiters.append((deadline, waiter))
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        try:
            taken = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot as it was cancelled
                self.release()
            raise
        if not taken:
            raise TransientProviderError(
                "pool_timeout",
                f"no connection to {self._target} came free within {self._within:g}s",
            )

    def release(self) -> None:
        """Give a slot back: to the oldest waiter still waiting, if there is one."""
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self._free += 1

    def _expire(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        waiters = self._waiters
        while waiters and (waiters[0][1].done() or waiters[0][0] <= now):
            _, waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
        if waiters:
            self._timer = asyncio.get_running_loop().call_at(waiters[0][0], self._expire)
