"""The history benchmark: does retained sent history slow the queue, and how fast does it go?

Two databases on the same server: one with an empty history, one with N sent rows retained
(10,000,000 by default), written by one set-based `generate_series` statement per million
rows and spread evenly over the last ten days. In each round both get the same batch of
ready rows, then:

- the claim (leasebox's own `claim`, 100 rows, rolled back each time so that every
  measurement sees the same table) and the backlog query (`fetch_backlog`) are timed, the
  two databases taking turns measurement by measurement, so that the load of the shared
  machine, which drifts over seconds, weighs on both alike (timed one database after the
  other, the claim's ratio ranged from 0.76 to 1.35 over ten full runs);
- a real `leasebox worker --drain` empties each batch, timed like the drain benchmark (the
  empty-queue start-up measured on the *empty* database is taken out of both, so a start-up
  that grows with history shows) and checked exactly-once.

Last, retention drops the oldest day of the retained history through leasebox's own
`prune`, timed, and the rows it removed are counted against what that day held.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from bench.accounting import percentile
from bench.drain import DrainResult, Idle, keep_better, measure_idle, settle, timed_drain
from bench.pgserver import BenchServer
from bench.sqlfiles import bench_query
from bench.systems import leasebox_system, seed_outbox, verify_outbox_from
from leasebox.db.partitions import database_today, ensure_partitions
from leasebox.store.backlog import GENERIC_PLANS, fetch_backlog
from leasebox.store.claiming import claim
from leasebox.store.pruning import prune

HISTORY_DAYS = 10
HISTORY_CHUNK = 1_000_000
CLAIM_BATCH = 100
DAY_SECONDS = 86_400.0


@dataclass(frozen=True)
class HistoryCase:
    """The queue's figures beside `history_rows` retained sent rows."""

    history_rows: int
    claim_ms: list[float]
    backlog_ms: list[float]
    drain: DrainResult | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "history_rows": self.history_rows,
            "claim_ms_median": round(percentile(self.claim_ms, 0.5), 3),
            "claim_ms_p95": round(percentile(self.claim_ms, 0.95), 3),
            "backlog_ms_median": round(percentile(self.backlog_ms, 0.5), 3),
            "backlog_ms_p95": round(percentile(self.backlog_ms, 0.95), 3),
            "drain": self.drain.as_dict() if self.drain else None,
        }


@dataclass(frozen=True)
class HistoryResult:
    days: int
    ready_rows: int
    seed_seconds: float
    cases: list[HistoryCase]
    prune_seconds: float | None = None
    pruned_rows: int = 0
    day_rows: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "days": self.days,
            "ready_rows": self.ready_rows,
            "seed_seconds": round(self.seed_seconds, 1),
            "cases": [c.as_dict() for c in self.cases],
            "prune_day_seconds": None
            if self.prune_seconds is None
            else round(self.prune_seconds, 3),
            "pruned_rows": self.pruned_rows,
            "day_rows": self.day_rows,
            "errors": self.errors,
        }


def seed_history(dsn: str, rows: int, days: int = HISTORY_DAYS) -> float:
    """`rows` sent messages over the `days` whole days before today (their day partitions
    made first, as the partition maintenance makes them), then VACUUM ANALYZE; seconds."""
    start = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        today = database_today(conn)
        ensure_partitions(conn, today=today - timedelta(days=days), ahead=days)
        for first in range(0, rows, HISTORY_CHUNK):
            count = min(HISTORY_CHUNK, rows - first)
            conn.execute(
                bench_query("seed_history"),
                {"first": first, "count": count, "total": rows, "days": days},
            )
    settle(dsn)
    return time.perf_counter() - start


def time_queries(dsns: Sequence[str], repeats: int) -> list[tuple[list[float], list[float]]]:
    """Milliseconds of each claim (rolled back) and each backlog query, per database in
    `dsns`; the databases take turns, one measurement each."""

    async def claims() -> list[list[float]]:
        async with contextlib.AsyncExitStack() as stack:
            conns = [
                await stack.enter_async_context(await psycopg.AsyncConnection.connect(dsn))
                for dsn in dsns
            ]
            return await take_turns_async([partial(_claim_once, conn) for conn in conns], repeats)

    claimed = asyncio.run(claims())
    with contextlib.ExitStack() as stack:
        conns = [  # as the operator's pool
            stack.enter_context(psycopg.connect(dsn, options=GENERIC_PLANS)) for dsn in dsns
        ]
        backlogs = take_turns([partial(_backlog_once, conn) for conn in conns], repeats)
    return list(zip(claimed, backlogs, strict=True))


async def _claim_once(conn: psycopg.AsyncConnection[Any]) -> None:
    rows = await claim(
        conn, kinds=["otp"], limit=CLAIM_BATCH, lease_seconds=45.0, worker_id="bench"
    )
    if len(rows) != CLAIM_BATCH:
        raise RuntimeError(f"claim found {len(rows)} rows, not {CLAIM_BATCH}")
    await conn.rollback()


def _backlog_once(conn: psycopg.Connection[Any]) -> None:
    fetch_backlog(conn, ["otp"])
    conn.rollback()


async def take_turns_async(
    actions: Sequence[Callable[[], Coroutine[Any, Any, None]]], repeats: int
) -> list[list[float]]:
    """Each action's milliseconds, `repeats` times, the actions taking turns (three of each
    first, untimed, to warm their connections)."""
    for _ in range(3):
        for action in actions:
            await action()
    found: list[list[float]] = [[] for _ in actions]
    for _ in range(repeats):
        for action, times in zip(actions, found, strict=True):
            start = time.perf_counter()
            await action()
            times.append((time.perf_counter() - start) * 1000)
    return found


def take_turns(actions: Sequence[Callable[[], None]], repeats: int) -> list[list[float]]:
    """`take_turns_async` for actions that block."""
    for _ in range(3):
        for action in actions:
            action()
    found: list[list[float]] = [[] for _ in actions]
    for _ in range(repeats):
        for action, times in zip(actions, found, strict=True):
            start = time.perf_counter()
            action()
            times.append((time.perf_counter() - start) * 1000)
    return found


def _next_id(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(bench_query("next_outbox_id")).fetchone()
    return int(row[0]) if row else 1


def prune_oldest_day(dsn: str, days: int) -> tuple[float, int, int]:
    """Retention dropping the oldest of `days` whole days of sent messages: (seconds,
    messages removed, messages the day held when counted just before)."""
    retention = (days - 1) * DAY_SECONDS
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            bench_query("history_oldest_day"), {"retention_seconds": retention}
        ).fetchone()
        held = int(row[0]) if row else 0
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        result = prune(conn, retention_seconds=retention)
        seconds = time.perf_counter() - start
    return seconds, result.sent, held


def retention_error(pruned: int, held: int) -> str:
    """Why a retention run removed the wrong messages, or "" when it removed the day."""
    if pruned == held:
        return ""
    return f"retention removed {pruned:,} messages; the oldest day held {held:,}"


def run_history(
    server: BenchServer,
    history_rows: int,
    ready_rows: int,
    repeats: int,
    *,
    rounds: int = 2,
    days: int = HISTORY_DAYS,
    progress: Callable[[str], None] = print,
) -> HistoryResult:
    system = leasebox_system()
    errors: list[str] = []
    with (
        server.database("history_empty", leasebox_schema=True) as empty,
        server.database("history_kept", leasebox_schema=True) as kept,
        tempfile.TemporaryDirectory(prefix="leasebox-bench-") as tmp,
    ):
        workdir = Path(tmp)
        progress(f"  history: seeding {history_rows:,} sent rows ...")
        seed_seconds = seed_history(kept, history_rows, days)
        progress(f"  history: seeded in {seed_seconds:.0f} s")
        idle = measure_idle(system, empty, 1, workdir)
        if isinstance(idle, str):
            errors.append(idle)
            idle = Idle(0.0, 0.0)
        found: dict[str, tuple[list[float], list[float], DrainResult | None]] = {
            empty: ([], [], None),
            kept: ([], [], None),
        }
        for round_number in range(rounds):
            first_ids = {dsn: _next_id(dsn) for dsn in (empty, kept)}
            for dsn in (empty, kept):
                seed_outbox(dsn, ready_rows, first=round_number * ready_rows)
                settle(dsn)
            timed = time_queries((empty, kept), max(repeats // rounds, 1))
            for dsn, (more_claims, more_backlogs) in zip((empty, kept), timed, strict=True):
                found[dsn][0].extend(more_claims)
                found[dsn][1].extend(more_backlogs)
            for dsn in (empty, kept):
                claims, backlogs, best = found[dsn]
                drained = timed_drain(
                    system,
                    dsn,
                    ready_rows,
                    1,
                    workdir,
                    idle,
                    verify=verify_outbox_from(first_ids[dsn]),
                )
                if not drained.ok:
                    errors.append(f"drain: {drained.error or drained.accounting}")
                found[dsn] = (claims, backlogs, keep_better(best, drained))
        progress("  history: retention drops the oldest day ...")
        prune_seconds, pruned, held = prune_oldest_day(kept, days)
        wrong = retention_error(pruned, held)
        if wrong:
            errors.append(wrong)
    cases = [HistoryCase(size, *found[dsn]) for size, dsn in ((0, empty), (history_rows, kept))]
    return HistoryResult(days, ready_rows, seed_seconds, cases, prune_seconds, pruned, held, errors)
