"""Dead letters, which wait for a person: list them, requeue them, or purge them.

A dead letter waits for a decision (fix the template or the address and requeue, or purge).
Everything here is synchronous and works in bounded batches, each its own short
transaction, so that it can run beside busy workers without holding locks for long. Rows
are read by name, never by position. A requeue writes a `requeued` row to the attempt
history; a purge deletes the rows' history with them, in the same statement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from leasebox.db.queries import DEFAULT_SCHEMA, query


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a command applies to; None means no restriction."""

    kinds: tuple[str, ...] | None = None
    reason: str | None = None
    error_class: str | None = None
    older_than_seconds: float | None = None
    newer_than_seconds: float | None = None
    ids: tuple[int, ...] | None = None
    limit: int | None = None

    def params(self) -> dict[str, Any]:
        return {
            "kinds": list(self.kinds) if self.kinds else None,
            "reason": self.reason,
            "error_class": self.error_class,
            "older_than_seconds": self.older_than_seconds,
            "newer_than_seconds": self.newer_than_seconds,
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
    with conn.cursor(row_factory=class_row(DeadLetter)) as cur:
        return cur.execute(query("list_dead_letters", schema), selection.params()).fetchall()


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
