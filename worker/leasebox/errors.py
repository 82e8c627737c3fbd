"""Every error leasebox raises on purpose, in one place, with one base class per concern.

Callers catch these by type (an HTTP API maps `IdempotencyConflict` to 422, `RateLimited`
to 429, `RecipientSuppressed` and `RecipientRefused` to 422 with their `reason`; the CLI
turns a `LeaseboxError` into one line and an exit code), so each carries the
figures a caller needs and never a secret, a password or a message body.

    LeaseboxError
    ├── ConfigurationError        a setting is missing or malformed
    │   └── PayloadKeyError       secrets cannot be sealed or opened with the configured keys
    │       └── MissingPayloadKeys  secrets are encrypted and no key is configured at all
    ├── DatabaseError             PostgreSQL cannot be used
    │   ├── DatabaseUnavailable   unreachable, or refused the connection
    │   └── NotMigrated           the schema is missing or older than this version
    ├── RequestRefused            the producer API refused a request; nothing was written
    │   ├── InvalidMessage        a field is malformed, or names what is not registered
    │   ├── IdempotencyConflict   the key was used for a different request (HTTP 422)
    │   │   └── BatchConflict     some messages of an `enqueue_many` batch did so
    │   ├── RateLimited           the abuse guard's limit is reached (HTTP 429)
    │   ├── AlreadyExpired        past its expires_at on the database's clock (a ValueError)
    │   ├── InvalidRequest        a key, scope or request hash cannot be used (a ValueError)
    │   ├── RecipientSuppressed   the address is on the scope's suppression list (HTTP 422)
    │   └── RecipientRefused      the domain policy refuses the address (HTTP 422)
    └── DeliveryError             a message could not be prepared or sent
        ├── TemplateError         a template is missing, malformed or lacks a variable
        ├── UnreadableData        a stored message's data cannot be decoded (nested too deep)
        ├── ProviderUnavailable   the provider cannot start (unreachable, bad credentials)
        └── ProviderError         one send failed; `permanence` says whether to retry
            ├── TransientProviderError
            │   └── AmbiguousProviderError   the provider may have taken it (no answer)
            └── PermanentProviderError
                ├── MessageExpired           past `expires_at` before it reached the wire
                └── MessageSuperseded        a newer message of its key was committed first
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# A failure's permanence: whether the worker tries again later or dead-letters the message now.
TRANSIENT = "transient"
PERMANENT = "permanent"


class LeaseboxError(Exception):
    """Base class of every error leasebox raises on purpose.

    `exit_code` is what a command exits with when the error ends it: 1 for a runtime
    failure (a database that cannot be reached, a schema not migrated), 2 for a usage or
    configuration error that no retry fixes.
    """

    exit_code = 1


class ConfigurationError(LeaseboxError):
    """A setting is missing or malformed (DSN, schema name, provider URL, keys, flags)."""

    exit_code = 2


class PayloadKeyError(ConfigurationError):
    """Secrets cannot be encrypted or decrypted with the configured keys."""


class MissingPayloadKeys(PayloadKeyError):
    """Secrets are encrypted and no key is configured: the process's fault, not the message's."""


class DatabaseError(LeaseboxError):
    """PostgreSQL cannot be used as configured (not psycopg's error of the same name)."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached or refused the connection."""


class NotMigrated(DatabaseError):
    """The leasebox schema is missing or older than this version expects."""

    def __init__(self, schema: str, detail: str = "") -> None:
        hint = f"run `leasebox migrate --schema {schema}`"
        super().__init__(
            f"the leasebox schema {schema!r} is not migrated{': ' + detail if detail else ''}; "
            f"{hint}"
        )
        self.schema = schema


class RequestRefused(LeaseboxError):
    """The producer API refused a request; nothing was written."""


class InvalidMessage(RequestRefused):
    """A message that cannot be sent as given; nothing was written.

    Raised by `OutboxMessage` for a malformed field (the pydantic `ValidationError` is the
    `__cause__`) and by `enqueue` for a kind, a template or a template variable the
    application has not registered. The message is one line that names the field and never
    quotes the refused value, which may be a secret. `field` is that field (`recipient`,
    `secrets.code`, `template`); `fields` every field refused, the first one first.
    """

    exit_code = 2
    MAX_LISTED = 10

    def __init__(self, field: str, problem: str, *, others: Sequence[str] = ()) -> None:
        listed = ", ".join(others[: self.MAX_LISTED]) + (
            ", …" if len(others) > self.MAX_LISTED else ""
        )
        more = f" (and {len(others)} more: {listed})" if others else ""
        super().__init__(f"invalid message: {field}: {problem}{more}")
        self.field = field
        self.problem = problem
        self.fields = (field, *others)


class IdempotencyConflict(RequestRefused):
    """A key was used before for a different request (HTTP analogue: 422).

    The key is an idempotency key in a scope, or (`delivery_key` set) an explicit delivery
    key that already belongs to a row sending a different message.
    """

    def __init__(
        self,
        scope: str,
        idempotency_key: str,
        outbox_id: int,
        *,
        delivery_key: str | None = None,
    ) -> None:
        if delivery_key is not None:
            text = (
                f"delivery key {delivery_key!r} was already used for a different message "
                f"(outbox id {outbox_id})"
            )
        else:
            text = (
                f"idempotency key {idempotency_key!r} in scope {scope!r} was already used for "
                f"a different request (outbox id {outbox_id})"
            )
        super().__init__(text)
        self.scope = scope
        self.idempotency_key = idempotency_key
        self.outbox_id = outbox_id
        self.delivery_key = delivery_key


@dataclass(frozen=True)
class ConflictingRequest:
    """One message of a batch that conflicts: its position in the batch and the key it reused.

    `outbox_id` is the row the key already belongs to (None when the conflict is with another
    message of the same batch)."""

    index: int
    idempotency_key: str | None
    delivery_key: str | None
    outbox_id: int | None


class BatchConflict(IdempotencyConflict):
    """Messages of an `enqueue_many` batch reuse keys for different requests; nothing was
    written. `conflicts` lists every one, in batch order."""

    MAX_LISTED = 10

    def __init__(self, scope: str, conflicts: Sequence[ConflictingRequest]) -> None:
        first = conflicts[0]
        super().__init__(
            scope,
            first.idempotency_key or "",
            first.outbox_id if first.outbox_id is not None else 0,
            delivery_key=first.delivery_key if first.idempotency_key is None else None,
        )
        listed = ", ".join(f"#{c.index} ({_conflict_key(c)})" for c in conflicts[: self.MAX_LISTED])
        more = len(conflicts) - self.MAX_LISTED
        self.args = (
            f"{len(conflicts)} message(s) of the batch reuse a key for a different request, "
            f"so nothing was written: {listed}{f' and {more} more' if more > 0 else ''}",
        )
        self.conflicts = tuple(conflicts)


def _conflict_key(conflict: ConflictingRequest) -> str:
    if conflict.idempotency_key is not None:
        return f"idempotency key {conflict.idempotency_key!r}"
    return f"delivery key {conflict.delivery_key!r}"


class RateLimited(RequestRefused):
    """The abuse guard refused another logical send in its window (HTTP analogue: 429)."""

    def __init__(self, limit_name: str, limit: int, window_seconds: float, retry_after: float):
        super().__init__(
            f"{limit_name} limit of {limit} sends per {window_seconds:g}s reached; "
            f"retry after {retry_after:.1f}s"
        )
        self.limit_name = limit_name
        self.limit = limit
        self.window_seconds = window_seconds
        self.retry_after = retry_after


class InvalidRequest(RequestRefused, ValueError):
    """An idempotency key, scope or request hash that cannot be used: too long, empty, or
    holding a character that is not printable (NUL, a lone surrogate, a line break). Refused
    before any statement, so the caller's transaction goes on (HTTP analogue: 400); the
    message names the argument and never quotes it."""

    exit_code = 2


class AlreadyExpired(RequestRefused, ValueError):
    """A new message is already past its `expires_at` on the database's clock, which every
    worker checks expiry on: it would never be sent. Usually the producer's clock runs behind
    the database's by more than the TTL. Nothing was written (HTTP analogue: 400)."""

    exit_code = 2

    def __init__(self, positions: Sequence[int] | None = None) -> None:
        which = (
            f"message(s) #{', #'.join(map(str, positions))} of the batch are"
            if positions is not None
            else "the message is"
        )
        super().__init__(
            f"{which} already past expires_at on the database's clock, so nothing was written; "
            "this producer's clock may run behind the database's (check NTP), or the TTL is "
            "shorter than the skew"
        )
        self.positions = tuple(positions or ())


class RecipientSuppressed(RequestRefused):
    """The address is on the scope's suppression list (HTTP analogue: 422).

    `reason` is why (`hard_bounce`, `complaint`, `soft_bounces`, `provider`, `manual`) and
    `expires_at` until when (None: until someone lifts it, `leasebox.lift_suppression`).
    The message names neither the address nor the scope's other entries.
    """

    def __init__(self, reason: str, expires_at: datetime | None) -> None:
        until = f" until {expires_at.isoformat(timespec='seconds')}" if expires_at else ""
        super().__init__(f"the address is suppressed ({reason}){until}")
        self.reason = reason
        self.expires_at = expires_at


class RecipientRefused(RequestRefused):
    """The domain policy refuses the address before anything is written (HTTP analogue: 422).

    `reason` is short and stable (`disposable_domain`, `invalid_domain`, `no_mail_server`)
    for an API to map to its own words; the message says it in a sentence.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class DeliveryError(LeaseboxError):
    """A message could not be prepared or sent."""


class UnreadableData(DeliveryError):
    """A stored message's `data` cannot be decoded (nested deeper than a worker can read): the
    message is invalid, and every attempt would fail the same way."""


class TemplateError(DeliveryError):
    """A template is missing, malformed or uses a variable the message does not supply.

    For the worker this is permanent: the same row would fail the same way on every retry.
    When it ends a command (a templates directory that is missing), it is a setting to fix.
    """

    exit_code = 2


class ProviderUnavailable(DeliveryError):
    """The mail provider refused to start (unreachable, bad credentials, TLS failure)."""


class ProviderError(DeliveryError):
    """A send or a connection failed; `permanence` tells the worker whether to retry.

    `permanence` is `transient` (retry with backoff) or `permanent` (dead-letter now): the
    class's (`TransientProviderError`, `PermanentProviderError`) unless given. `code` is short
    and low-cardinality (`smtp_550`, `timeout`); the message is one short line that never
    contains a body, a secret or a password. `retry_after` is how long the provider asked to
    be left alone (HTTP 429 `Retry-After`), in seconds: the next attempt waits at least that
    long. `outcome` is what the request amounted to for the provider's health metrics
    (`throttled`, `account`, ...; see `delivery.providers.base.RequestOutcome`), when the
    provider knows better than its status code says.

    `error_class` is the old name of `permanence` (the keyword, a subclass's attribute and
    the read-only property): deprecated, it still works until the next release.
    """

    permanence: str = TRANSIENT

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("error_class")
        if isinstance(declared, str):  # a provider's subclass written for the old name
            _warn_error_class(stacklevel=3)
            cls.permanence = declared

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retry_after: float | None = None,
        outcome: str | None = None,
        permanence: str | None = None,
        error_class: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
        self.outcome = outcome
        if error_class is not None:
            _warn_error_class(stacklevel=3)
            permanence = error_class if permanence is None else permanence
        if permanence is not None:
            self.permanence = permanence

    @property
    def error_class(self) -> str:
        """Deprecated: `permanence`."""
        _warn_error_class(stacklevel=3)
        return self.permanence

    @property
    def transient(self) -> bool:
        return self.permanence == TRANSIENT

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={str(self)!r})"


def _warn_error_class(stacklevel: int) -> None:
    warnings.warn(
        "ProviderError's `error_class` is deprecated and goes in the next release: "
        "use `permanence` (`transient` or `permanent`)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class TransientProviderError(ProviderError):
    """Worth retrying later: timeouts, refused connections, SMTP 4xx, HTTP 408/429/5xx."""

    permanence = TRANSIENT


class PermanentProviderError(ProviderError):
    """Retrying cannot help: a refused recipient, a rejected request."""

    permanence = PERMANENT


class AmbiguousProviderError(TransientProviderError):
    """The message may or may not have been accepted: the whole message reached the provider,
    then the connection was lost (or the reply never came) before it said yes or no.

    Never sent again within the same attempt; the next attempt, after the usual backoff,
    carries the same delivery key (SMTP Message-ID, HTTP Idempotency-Key), so a provider that
    deduplicates drops the copy. Counted as `error_class="ambiguous"`.
    """

    def __init__(self, message: str, *, code: str = "ambiguous") -> None:
        super().__init__(code, message)


class MessageExpired(PermanentProviderError):
    """The message's `expires_at` passed while it waited (for a connection, a rate limit)
    and before any of it was written to the wire: it is dead-lettered `expired`, not sent."""

    def __init__(self, message: str = "expired before it could be written to the wire") -> None:
        super().__init__("expired", message)


class MessageSuperseded(PermanentProviderError):
    """A newer message of the same replacement key was committed while this one waited, and
    before any of it was written to the wire: it ends `superseded`, not sent (nor retried)."""

    def __init__(self, message: str = "superseded before it could be written to the wire") -> None:
        super().__init__("superseded", message)
