"""The worker's SQL repository: claim rows under a lease, and settle them while the lease holds.

Every statement here is one round trip on an autocommit connection, so a claim is committed
before the caller sends anything and no lock outlives its statement. Settling statements
(`mark_sent`, `schedule_retry`, `mark_dead`, `extend_leases`, `release_leases`) take many rows
at once and match each on its lease token and `status = 'processing'`; they return the ids
that matched, and an id missing from the answer is a lease the caller no longer owns.

`now` is None in production (the database's clock, shared by all workers); tests pass a
datetime to move time without sleeping.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from leasebox.queries import DEFAULT_SCHEMA, query
from leasebox.retrying import DEFAULT_MAX_ATTEMPTS

Connection = psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class ClaimedMessage:
    """One outbox row as claimed: what to send, and the lease that allows settling it."""

    id: int
    kind: str
    aggregate_id: str | None
    recipient: str = field(repr=False)
    template: str
    data: dict[str, Any] = field(repr=False)
    secrets: bytes | None = field(repr=False)
    delivery_key: str
    attempts: int
    max_attempts: int | None
    expires_at: datetime | None
    lease_token: uuid.UUID
    lease_expires_at: datetime
    created_at: datetime
    claimed_at: datetime


@dataclass(frozen=True)
class LeaseRef:
    """A row and the lease token its settling statement must match."""

    id: int
    token: uuid.UUID


@dataclass(frozen=True)
class Sent:
    lease: LeaseRef
    provider_message_id: str | None


@dataclass(frozen=True)
class Retry:
    lease: LeaseRef
    delay_seconds: float
    error: str
    error_class: str


@dataclass(frozen=True)
class Dead:
    lease: LeaseRef
    reason: str
    error: str
    error_class: str | None


@dataclass(frozen=True)
class Reclaimed:
    """A row whose lease ran out: back to `pending`, or `dead` when out of attempts."""

    id: int
    kind: str
    status: str


async def claim(
    conn: Connection,
    *,
    kinds: Sequence[str],
    limit: int,
    lease_seconds: float,
    worker_id: str,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> list[ClaimedMessage]:
    """Lease up to `limit` ready rows of `kinds`, oldest availability first."""
    if limit <= 0:
        return []
    params = {
        "kinds": list(kinds),
        "limit": limit,
        "lease_seconds": lease_seconds,
        "worker_id": worker_id,
        "now": now,
    }
    async with conn.cursor() as cur:
        await cur.execute(query("claim", schema), params)
        rows = await cur.fetchall()
    return [ClaimedMessage(*row) for row in rows]


async def mark_sent(
    conn: Connection,
    items: Sequence[Sent],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> dict[int, float]:
    """Mark rows sent; returns id -> seconds from creation to sent for the rows still owned."""
    if not items:
        return {}
    params = {
        "ids": [item.lease.id for item in items],
        "tokens": [item.lease.token for item in items],
        "provider_message_ids": [item.provider_message_id for item in items],
        "now": now,
    }
    async with conn.cursor() as cur:
        await cur.execute(query("mark_sent", schema), params)
        rows = await cur.fetchall()
    return {int(row[0]): row[1].total_seconds() for row in rows}


async def schedule_retry(
    conn: Connection,
    items: Sequence[Retry],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> set[int]:
    """Return rows to `pending`, ready again after their delay; returns the ids still owned."""
    if not items:
        return set()
    params = {
        "ids": [item.lease.id for item in items],
        "tokens": [item.lease.token for item in items],
        "delays": [item.delay_seconds for item in items],
        "errors": [item.error for item in items],
        "error_classes": [item.error_class for item in items],
        "now": now,
    }
    return await _ids(conn, "schedule_retry", schema, params)


async def mark_dead(
    conn: Connection,
    items: Sequence[Dead],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> set[int]:
    """Dead-letter rows with a reason; returns the ids still owned."""
    if not items:
        return set()
    params = {
        "ids": [item.lease.id for item in items],
        "tokens": [item.lease.token for item in items],
        "reasons": [item.reason for item in items],
        "errors": [item.error for item in items],
        "error_classes": [item.error_class for item in items],
        "now": now,
    }
    return await _ids(conn, "mark_dead", schema, params)


async def extend_leases(
    conn: Connection,
    leases: Sequence[LeaseRef],
    *,
    lease_seconds: float,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> dict[int, datetime]:
    """Push the leases' expiry to now + `lease_seconds`; returns id -> new expiry if owned."""
    if not leases:
        return {}
    params = {
        "ids": [lease.id for lease in leases],
        "tokens": [lease.token for lease in leases],
        "lease_seconds": lease_seconds,
        "now": now,
    }
    async with conn.cursor() as cur:
        await cur.execute(query("extend_leases", schema), params)
        rows = await cur.fetchall()
    return {int(row[0]): row[1] for row in rows}


async def release_leases(
    conn: Connection,
    leases: Sequence[LeaseRef],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> set[int]:
    """Give rows back unsent, ready at once, with the claim's attempt undone."""
    if not leases:
        return set()
    params = {
        "ids": [lease.id for lease in leases],
        "tokens": [lease.token for lease in leases],
        "now": now,
    }
    return await _ids(conn, "release_leases", schema, params)


async def reclaim_expired_leases(
    conn: Connection,
    *,
    limit: int = 500,
    default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> list[Reclaimed]:
    """Take back rows whose lease ran out (their worker died or stalled).

    Rows out of attempts (their own limit, else `default_max_attempts`) become dead letters.
    """
    params = {"limit": limit, "now": now, "default_max_attempts": default_max_attempts}
    async with conn.cursor() as cur:
        await cur.execute(query("reclaim_expired_leases", schema), params)
        rows = await cur.fetchall()
    return [Reclaimed(int(row[0]), row[1], row[2]) for row in rows]


async def dead_letter_expired(
    conn: Connection,
    *,
    limit: int = 500,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> list[tuple[int, str]]:
    """Dead-letter pending rows past their `expires_at` (reason `expired`); (id, kind) each."""
    async with conn.cursor() as cur:
        await cur.execute(query("dead_letter_expired", schema), {"limit": limit, "now": now})
        rows = await cur.fetchall()
    return [(int(row[0]), row[1]) for row in rows]


async def _ids(conn: Connection, name: str, schema: str, params: dict[str, Any]) -> set[int]:
    async with conn.cursor() as cur:
        await cur.execute(query(name, schema), params)
        rows = await cur.fetchall()
    return {int(row[0]) for row in rows}
