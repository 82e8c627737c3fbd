"""A worker given a retention drops the days past it on its own, hourly, with the partition
maintenance; without one it keeps everything. Every worker of a schema does it, so two at
once must both succeed and drop each day once.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from leasebox.db.connections import APPLICATION_NAME, connect
from leasebox.db.partitions import day_partition_name, ensure_partitions, serialise_maintenance
from leasebox.runtime.upkeep import maintain_days
from leasebox.store import pruning
from leasebox.store.pruning import PruneResult
from support.running_worker import SETTINGS, make_worker, running
from support.waiting import wait_for, wait_for_async, waiting_on_a_lock
from support.worker_doubles import Insert, ManualClock, ScriptedProvider

WEEK = 7 * 86400.0


def _messages(conn: psycopg.Connection[Any]) -> set[int]:
    found = {int(row[0]) for row in conn.execute("SELECT id FROM leasebox.messages")}
    conn.rollback()
    return found


def _old_and_recent(db_insert: Insert, db_now: datetime) -> tuple[list[int], int]:
    old = [db_insert(status="sent", sent_at=db_now - timedelta(days=9)) for _ in range(3)]
    recent = db_insert(status="sent", sent_at=db_now - timedelta(days=1))
    return old, recent


def test_the_upkeep_drops_the_days_past_the_retention_and_keeps_the_rest(
    db_conn: psycopg.Connection[Any], db_dsn: str, db_insert: Insert, db_now: datetime
) -> None:
    _old, recent = _old_and_recent(db_insert, db_now)
    db_conn.commit()

    pruned = maintain_days(db_dsn, "leasebox", WEEK)

    assert pruned is not None
    assert (pruned.sent, pruned.kept) == (3, 0)
    assert pruned.partitions
    assert _messages(db_conn) == {recent}


def test_the_upkeep_without_a_retention_drops_nothing(
    db_conn: psycopg.Connection[Any], db_dsn: str, db_insert: Insert, db_now: datetime
) -> None:
    old, recent = _old_and_recent(db_insert, db_now)
    db_conn.commit()

    assert maintain_days(db_dsn, "leasebox", None) is None
    assert _messages(db_conn) == {*old, recent}


def test_two_workers_pruning_at_once_both_succeed_and_drop_each_day_once(
    db_conn: psycopg.Connection[Any], db_dsn: str, db_insert: Insert, db_now: datetime
) -> None:
    _old, recent = _old_and_recent(db_insert, db_now)
    db_conn.commit()
    start = threading.Barrier(2)

    def one_worker() -> PruneResult | None:
        start.wait(timeout=10)
        return maintain_days(db_dsn, "leasebox", WEEK)

    with ThreadPoolExecutor(2) as workers:
        results = [f.result(timeout=60) for f in [workers.submit(one_worker) for _ in range(2)]]

    assert all(r is not None for r in results)
    assert sorted(r.sent for r in results if r is not None) == [0, 3]
    assert _messages(db_conn) == {recent}


async def test_a_running_worker_with_a_retention_drops_the_days_past_it(
    db_dsn: str,
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    _old, recent = _old_and_recent(db_insert, db_now)
    db_conn.commit()
    settings = replace(SETTINGS, retention_seconds=WEEK)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings, dsn=db_dsn)
    async with running(worker):
        await wait_for_async(
            lambda: _messages(db_conn) == {recent},
            what="_messages(db_conn) == {recent}",
            timeout=30,
        )


def test_a_prune_counting_the_days_while_another_drops_them_succeeds(
    db_conn: psycopg.Connection[Any],
    db_dsn: str,
    db_insert: Insert,
    db_now: datetime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The partitions of the coming days exist already, so the prune goes straight to counting
    # the old days while another prune (the other connection, as `prune` does it) holds them.
    _old, recent = _old_and_recent(db_insert, db_now)
    db_conn.commit()
    ensure_partitions(db_conn)
    monkeypatch.setattr(pruning, "ensure_partitions", lambda conn, schema: [])
    day = (db_now - timedelta(days=9)).date()
    doomed = [sql.Identifier("leasebox", day_partition_name(t, day)) for t in ("outbox", "history")]
    with psycopg.connect(db_dsn) as other, ThreadPoolExecutor(1) as worker:
        serialise_maintenance(other)
        other.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(doomed[0]))
        counting = worker.submit(_prune_week, db_dsn)
        wait_for(lambda: waiting_on_a_lock(db_conn, APPLICATION_NAME), what="prune to wait")
        for table in doomed:
            other.execute(sql.SQL("DROP TABLE {}").format(table))
        other.commit()
        pruned = counting.result(timeout=60)
    assert (pruned.sent, pruned.partitions) == (0, ())
    assert _messages(db_conn) == {recent}


def _prune_week(dsn: str) -> PruneResult:
    with connect(dsn, autocommit=True) as conn:
        return pruning.prune(conn, retention_seconds=WEEK)


def test_a_prune_never_deadlocks_with_a_reader_that_holds_the_table_and_reads_an_old_day(
    db_conn: psycopg.Connection[Any], db_dsn: str, db_insert: Insert, db_now: datetime
) -> None:
    # A query on the outbox locks the table, then each day it reads; a prune that locked an
    # old day first and then asked for the table (as dropping the day does) closed a cycle.
    _old, recent = _old_and_recent(db_insert, db_now)
    db_conn.commit()
    ensure_partitions(db_conn)
    day = day_partition_name("outbox", (db_now - timedelta(days=9)).date())
    with psycopg.connect(db_dsn) as reader, ThreadPoolExecutor(1) as worker:
        reader.execute("LOCK TABLE ONLY leasebox.outbox IN ACCESS SHARE MODE")
        pruning_done = worker.submit(_prune_week, db_dsn)
        wait_for(lambda: waiting_on_a_lock(db_conn, APPLICATION_NAME), what="prune to wait")
        row = reader.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("leasebox", day))
        ).fetchone()
        assert row == (3,)
        reader.commit()
        pruned = pruning_done.result(timeout=60)
    assert pruned.sent == 3
    assert _messages(db_conn) == {recent}
