"""Sweeps any worker runs for all of them: reclaim expired leases, dead-letter expired OTPs.

A worker that dies holding rows leaves them `processing` with a lease that runs out; any
other worker's sweep takes them back (`pending`, or `dead` once out of attempts, since
attempts are counted at claim and a message that kills its worker every time must end). An
OTP still pending past its `expires_at` becomes a dead letter (`expired`): never sent late.
Both statements work in bounded batches with `SKIP LOCKED`, so sweepers never queue up
behind each other, and each writes its rows' history as it changes them: `lease_expired`
(the lease that ran out, its holder and when, and `attempts_exhausted` when the row died)
and `expired`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import class_row

from leasebox.db.queries import DEFAULT_SCHEMA, query_bytes
from leasebox.states import Status
from leasebox.store.claiming import Connection


@dataclass(frozen=True)
class Reclaimed:
    """A row whose lease ran out: back to `pending`, or `dead` when out of attempts."""

    id: int
    kind: str
    status: Status


@dataclass(frozen=True)
class Expired:
    """A pending row dead-lettered because its `expires_at` passed."""

    id: int
    kind: str


async def reclaim_expired_leases(
    conn: Connection,
    *,
    default_max_attempts: int,
    limit: int = 500,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> list[Reclaimed]:
    """Take back rows whose lease ran out (their worker died or stalled).

    Rows out of attempts (their own limit, else `default_max_attempts`) become dead letters.
    """
    params = {"limit": limit, "now": now, "default_max_attempts": default_max_attempts}
    async with conn.cursor(row_factory=class_row(Reclaimed)) as cur:
        await cur.execute(query_bytes("reclaim_expired_leases", schema), params)
        rows = await cur.fetchall()
    return [Reclaimed(row.id, row.kind, Status(row.status)) for row in rows]


async def dead_letter_expired(
    conn: Connection,
    *,
    limit: int = 500,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> list[Expired]:
    """Dead-letter pending rows past their `expires_at` (reason `expired`)."""
    async with conn.cursor(row_factory=class_row(Expired)) as cur:
        await cur.execute(query_bytes("dead_letter_expired", schema), {"limit": limit, "now": now})
        return await cur.fetchall()
