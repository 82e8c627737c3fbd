"""The backlog of a set of kinds, in one cheap, index-driven round trip.

The operator polls this every few seconds per pool and `leasebox status` prints it. Each
figure comes from a partial index (pending, processing, dead, recent sends), and the recent
sends from the history's partitions of the last days alone, so the cost grows neither with
the number of sent messages kept nor with the number of days.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from leasebox.db.queries import DEFAULT_SCHEMA, query

RATE_WINDOW_SECONDS = 60.0
# The session setting a connection polling the backlog should have (libpq `options`): the
# query's generic plan is planned once per connection, and it prunes the history's day
# partitions when it starts; a custom plan is planned again each poll, over every retained
# day's partition, which costs more than running it.
GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"


@dataclass(frozen=True)
class KindBacklog:
    """Counts and ages for one kind."""

    kind: str
    pending: int
    ready: int
    processing: int
    expired_leases: int
    dead: int
    oldest_pending_created_at: datetime | None
    oldest_ready_available_at: datetime | None
    sent_in_window: int


@dataclass(frozen=True)
class Backlog:
    """The backlog of a set of kinds, as seen by the database at `observed_at`."""

    kinds: tuple[KindBacklog, ...]
    observed_at: datetime
    window_seconds: float = RATE_WINDOW_SECONDS

    def _sum(self, name: str) -> int:
        return sum(int(getattr(k, name)) for k in self.kinds)

    @property
    def pending(self) -> int:
        return self._sum("pending")

    @property
    def ready(self) -> int:
        return self._sum("ready")

    @property
    def processing(self) -> int:
        return self._sum("processing")

    @property
    def expired_leases(self) -> int:
        return self._sum("expired_leases")

    @property
    def dead(self) -> int:
        return self._sum("dead")

    @property
    def oldest_pending_created_at(self) -> datetime | None:
        return min(
            (k.oldest_pending_created_at for k in self.kinds if k.oldest_pending_created_at),
            default=None,
        )

    @property
    def oldest_ready_available_at(self) -> datetime | None:
        return min(
            (k.oldest_ready_available_at for k in self.kinds if k.oldest_ready_available_at),
            default=None,
        )

    @property
    def oldest_pending_age_seconds(self) -> float:
        """Age of the oldest pending message since it was created (the SLA clock); 0 if none."""
        oldest = self.oldest_pending_created_at
        return max((self.observed_at - oldest).total_seconds(), 0.0) if oldest else 0.0

    @property
    def oldest_ready_age_seconds(self) -> float:
        """How long the oldest ready message has been claimable; 0 if none."""
        oldest = self.oldest_ready_available_at
        return max((self.observed_at - oldest).total_seconds(), 0.0) if oldest else 0.0

    @property
    def sent_per_second(self) -> float:
        return self._sum("sent_in_window") / self.window_seconds

    def of_kinds(self, kinds: Sequence[str]) -> Backlog:
        """The part of this backlog that covers `kinds` (one query can answer many pools)."""
        wanted = set(kinds)
        if all(k.kind in wanted for k in self.kinds):
            return self
        mine = tuple(k for k in self.kinds if k.kind in wanted)
        return Backlog(kinds=mine, observed_at=self.observed_at, window_seconds=self.window_seconds)

    def by_kind(self) -> dict[str, Backlog]:
        """One backlog per kind, observed at the same instant."""
        return {k.kind: Backlog((k,), self.observed_at, self.window_seconds) for k in self.kinds}

    def as_dict(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "ready": self.ready,
            "processing": self.processing,
            "dead": self.dead,
            "expiredLeases": self.expired_leases,
            "oldestPendingAgeSeconds": round(self.oldest_pending_age_seconds, 3),
            "oldestReadyAgeSeconds": round(self.oldest_ready_age_seconds, 3),
            "sentPerSecond": round(self.sent_per_second, 3),
        }


def _params(kinds: Sequence[str], window_seconds: float) -> dict[str, Any]:
    if not kinds:
        raise ValueError("the backlog needs at least one kind")
    return {"kinds": list(dict.fromkeys(kinds)), "window_seconds": window_seconds}


def _build(rows: list[tuple[Any, ...]], window_seconds: float) -> Backlog:
    kinds = tuple(KindBacklog(*row[:9]) for row in rows)
    return Backlog(kinds=kinds, observed_at=rows[0][9], window_seconds=window_seconds)


def fetch_backlog(
    conn: psycopg.Connection[Any],
    kinds: Sequence[str],
    *,
    schema: str = DEFAULT_SCHEMA,
    window_seconds: float = RATE_WINDOW_SECONDS,
) -> Backlog:
    """The backlog of `kinds`, in one statement."""
    rows = conn.execute(query("backlog", schema), _params(kinds, window_seconds)).fetchall()
    return _build(rows, window_seconds)


async def fetch_backlog_async(
    conn: psycopg.AsyncConnection[Any],
    kinds: Sequence[str],
    *,
    schema: str = DEFAULT_SCHEMA,
    window_seconds: float = RATE_WINDOW_SECONDS,
) -> Backlog:
    """`fetch_backlog` for an async connection."""
    cur = await conn.execute(query("backlog", schema), _params(kinds, window_seconds))
    return _build(await cur.fetchall(), window_seconds)


def known_kinds(conn: psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """Kinds that have unfinished or dead rows (for `leasebox status` without --kinds)."""
    return [str(r[0]) for r in conn.execute(query("known_kinds", schema))]
