"""What a person does to the outbox by hand: inspect, requeue and purge dead letters; prune.

Dead letters wait for a decision (fix the template and requeue, or purge); sent rows and
expired receipts are history that the queue tables should not carry forever. Everything
here is synchronous and works in bounded batches, each its own short transaction, so that
it can run beside busy workers without holding locks for long.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from leasebox.errors import ConfigurationError
from leasebox.queries import DEFAULT_SCHEMA, query

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in `90`, `90s`, `15m`, `1h`, `7d` or `2w`."""
    match = _DURATION.fullmatch(text.lower())
    if not match:
        raise ConfigurationError(
            f"invalid duration {text!r}: use a number with s, m, h, d or w, e.g. 1h or 7d"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a command applies to; None means no restriction."""

    kinds: tuple[str, ...] | None = None
    reason: str | None = None
    older_than_seconds: float | None = None
    ids: tuple[int, ...] | None = None
    limit: int | None = None

    def params(self) -> dict[str, Any]:
        return {
            "kinds": list(self.kinds) if self.kinds else None,
            "reason": self.reason,
            "older_than_seconds": self.older_than_seconds,
            "ids": list(self.ids) if self.ids else None,
            "limit": self.limit,
        }


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter as listed: identifiers, counts and the error, never the message."""

    id: int
    kind: str
    aggregate_id: str | None
    delivery_key: str
    attempts: int
    max_attempts: int | None
    dead_reason: str | None
    last_error_class: str | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["created_at"] = self.created_at.isoformat()
        data["updated_at"] = self.updated_at.isoformat()
        return data


def list_dead_letters(
    conn: psycopg.Connection[Any], selection: DeadLetterFilter, *, schema: str = DEFAULT_SCHEMA
) -> list[DeadLetter]:
    """Dead letters matching `selection`, oldest first."""
    rows = conn.execute(query("list_dead_letters", schema), selection.params()).fetchall()
    return [DeadLetter(*row) for row in rows]


def count_dead_letters(
    conn: psycopg.Connection[Any], selection: DeadLetterFilter, *, schema: str = DEFAULT_SCHEMA
) -> int:
    """How many dead letters match `selection` (its limit aside)."""
    row = conn.execute(query("count_dead_letters", schema), selection.params()).fetchone()
    count = int(row[0]) if row else 0
    return count if selection.limit is None else min(count, selection.limit)


def requeue_dead_letters(
    conn: psycopg.Connection[Any],
    selection: DeadLetterFilter,
    *,
    clear_expiry: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """Make matching dead letters pending again, with a fresh attempt budget; commits.

    A requeued OTP past its `expires_at` is dead-lettered again as `expired` unless
    `clear_expiry` is set, which sends a stale code late; usually a fresh code is better.
    """
    params = {**selection.params(), "clear_expiry": clear_expiry}
    rows = conn.execute(query("requeue_dead_letters", schema), params).fetchall()
    conn.commit()
    return sorted(int(row[0]) for row in rows)


def purge_dead_letters(
    conn: psycopg.Connection[Any],
    selection: DeadLetterFilter,
    *,
    schema: str = DEFAULT_SCHEMA,
    batch_size: int = 1000,
) -> int:
    """Delete matching dead letters in batches (each committed); returns how many."""
    deleted = 0
    while selection.limit is None or deleted < selection.limit:
        step = batch_size if selection.limit is None else min(batch_size, selection.limit - deleted)
        params = {**selection.params(), "limit": step}
        rows = conn.execute(query("purge_dead_letters", schema), params).fetchall()
        conn.commit()
        deleted += len(rows)
        if len(rows) < step:
            break
    return deleted


@dataclass(frozen=True)
class PruneResult:
    sent: int
    receipts: int


def prune(
    conn: psycopg.Connection[Any],
    *,
    retention_seconds: float,
    batch_size: int = 5000,
    schema: str = DEFAULT_SCHEMA,
) -> PruneResult:
    """Delete sent rows and expired receipts older than the retention, batch by batch."""
    if retention_seconds < 0:
        raise ConfigurationError("the retention must not be negative")
    if batch_size < 1:
        raise ConfigurationError("the batch size must be at least 1")
    params = {"retention_seconds": retention_seconds, "limit": batch_size}
    totals = []
    for name in ("prune_sent", "prune_receipts"):
        total = 0
        while True:
            count = conn.execute(query(name, schema), params).rowcount
            conn.commit()
            total += max(count, 0)
            if count < batch_size:
                break
        totals.append(total)
    return PruneResult(sent=totals[0], receipts=totals[1])
