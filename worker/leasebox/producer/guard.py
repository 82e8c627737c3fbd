"""The abuse guard: limits on logical sends per recipient and per scope, against OTP bombing.

A login form that sends a code to any address typed into it is a way to flood someone's
inbox. The guard counts *logical sends* (rows, not requests: a retried request that reuses
its receipt or its delivery key never counts) inside a sliding window, serialised per
counted subject by a row of `guard_subjects` so that racing requests cannot all slip under
the limit, and refuses the next one with `RateLimited`, whose `retry_after` is when the
oldest send leaves the window. It holds at every isolation level: where the caller's
snapshot predates a concurrent send (REPEATABLE READ, SERIALIZABLE), the request fails with
a serialization failure instead of counting too few.

Recipients are counted by their normalised form (`OutboxMessage.recipient_key`), which the
row stores and an index serves, so `Ada@Example.com` and `ada@example.com` share one limit.
Scopes are counted on the rows too, so a per-scope limit holds with or without an
idempotency key.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from leasebox.errors import ConfigurationError, RateLimited
from leasebox.producer.plan import Row, Step


@dataclass(frozen=True)
class AbuseGuard:
    """Optional limits on logical sends in a sliding window; a limit of None is off.

    per_recipient: sends to one address in the window.
    per_scope: sends in one scope (for example one API client or tenant) in the window.
    window_seconds: the window's length.
    """

    per_recipient: int | None = None
    per_scope: int | None = None
    window_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("per_recipient", "per_scope"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigurationError(f"the abuse guard's {name} must be at least 1 or None")
        if not self.window_seconds > 0:
            raise ConfigurationError("the abuse guard's window_seconds must be positive")


def check_guard(guard: AbuseGuard, recipient_key: str, scope: str) -> Generator[Step, Row, None]:
    """The plan steps that count and lock; raises `RateLimited` when a limit is reached.

    `recipient_key` is the normalised recipient. Each limit rewrites its subject's row and
    counts, in one round trip: the row serialises the callers, and under REPEATABLE READ or
    SERIALIZABLE it fails a caller whose snapshot cannot see another's send (a serialization
    failure, which the application retries) instead of letting it count too few. The rows
    are taken in a fixed order (recipient, then scope) after the receipt and delivery-key
    locks, so no two producers wait for each other in a cycle.
    """
    checks: list[tuple[str, int, str, dict[str, Any]]] = []
    if guard.per_recipient is not None:
        checks.append(
            (
                "per-recipient",
                guard.per_recipient,
                "count_recipient_window",
                {"recipient_key": recipient_key},
            )
        )
    if guard.per_scope is not None:
        checks.append(("per-scope", guard.per_scope, "count_scope_window", {"scope": scope}))
    for label, limit, query_name, params in checks:
        subject = f"leasebox.guard\x1f{label}\x1f{next(iter(params.values()))}"
        row = yield Step(
            (
                ("touch_guard_subject", {"subject": subject}),
                (query_name, {**params, "window_seconds": guard.window_seconds}),
            )
        )
        if row is not None and row["n"] >= limit:
            retry_after = guard.window_seconds - (row["now"] - row["oldest"]).total_seconds()
            raise RateLimited(label, limit, guard.window_seconds, max(retry_after, 0.0))
