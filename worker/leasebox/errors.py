"""The errors leasebox raises to its callers, in one place.

Callers catch these by type (an HTTP API maps `IdempotencyConflict` to 422 and `RateLimited`
to 429), so each carries the figures a caller needs and never a secret or a message body.
"""

from __future__ import annotations


class LeaseboxError(Exception):
    """Base class of every error leasebox raises on purpose.

    `exit_code` is what a command exits with when the error ends it: 1 for a runtime
    failure (a database that cannot be reached, a schema not migrated), 2 for a usage or
    configuration error that no retry fixes.
    """

    exit_code = 1


class ConfigurationError(LeaseboxError):
    """A setting is missing or malformed (DSN, schema name, provider URL, keys)."""

    exit_code = 2


class DatabaseUnavailable(LeaseboxError):
    """The database cannot be reached or refused the connection."""


class NotMigrated(LeaseboxError):
    """The leasebox schema is missing or older than this version expects."""

    def __init__(self, schema: str, detail: str = "") -> None:
        hint = f"run `leasebox migrate --schema {schema}`"
        super().__init__(
            f"the leasebox schema {schema!r} is not migrated{': ' + detail if detail else ''}; "
            f"{hint}"
        )
        self.schema = schema


class IdempotencyConflict(LeaseboxError):
    """The idempotency key was used before with a different request (HTTP analogue: 422)."""

    def __init__(self, scope: str, idempotency_key: str, outbox_id: int) -> None:
        super().__init__(
            f"idempotency key {idempotency_key!r} in scope {scope!r} was already used for a "
            f"different request (outbox id {outbox_id})"
        )
        self.scope = scope
        self.idempotency_key = idempotency_key
        self.outbox_id = outbox_id


class RateLimited(LeaseboxError):
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


class PayloadKeyError(LeaseboxError):
    """Secrets cannot be encrypted or decrypted with the configured keys."""

    exit_code = 2
