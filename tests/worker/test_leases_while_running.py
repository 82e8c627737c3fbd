"""Leases in the running worker: extended while a send runs, lost to another worker, reclaimed.

The races are real: the test plays worker B with the same statements a worker runs
(reclaim, claim), against the same rows, while worker A holds them; A is let go only once B
owns the row and has not settled it, so that nothing but the lease token can stop A.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.runtime.worker import Worker
from leasebox.store import claiming, settling, sweeps
from leasebox.store.settling import Sent
from support.history import history_of
from support.running_worker import SETTINGS, log_records, make_worker, running
from support.waiting import wait_for_async
from support.worker_doubles import Insert, ManualClock, ScriptedProvider, row_of

LOST = "lease could not be extended: lost"


async def test_a_worker_stalled_past_its_lease_cannot_settle_the_row_another_worker_holds(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    db_aconn: psycopg.AsyncConnection,
) -> None:
    outbox_id = db_insert(recipient="stall@example.com")
    release = fake_provider.hold("stall@example.com")
    worker = make_worker(db_pool, fake_provider, fake_clock)
    async with running(worker):
        await fake_provider.held["stall@example.com"].wait()
        # The stall: time passes beyond the lease while A's send hangs. B reclaims the row
        # and claims it, and is still sending it when A's send returns.
        later = fake_clock.now + timedelta(seconds=60)
        assert await sweeps.reclaim_expired_leases(db_aconn, default_max_attempts=8, now=later)
        [taken] = await claiming.claim(
            db_aconn, kinds=["otp"], limit=1, lease_seconds=45, worker_id="worker-b", now=later
        )
        fake_clock.now = later
        release.set()
        await wait_for_async(
            lambda: worker.held == 0, what="worker.held == 0"
        )  # A's outcome met the database
        assert worker.metrics.value("leasebox_lease_lost_total", {"kind": "otp"}) == 1
        row = row_of(db_conn, outbox_id)
        assert (row["status"], row["lease_token"], row["leased_by"]) == (
            "processing",
            taken.lease_token,
            "worker-b",
        )
        assert row["provider_message_id"] is None
        # B, still the owner, settles it.
        done = await settling.mark_sent(db_aconn, [Sent(taken.lease, "from-b")], now=later)
        assert list(done) == [outbox_id]
    assert row_of(db_conn, outbox_id)["provider_message_id"] == "from-b"
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 0
    # The history keeps what A learnt too late: the provider took a copy from it.
    a = worker.settings.worker_id
    history = history_of(db_conn, outbox_id)
    assert [(e.event, e.worker_id) for e in history] == [
        ("claimed", a),
        ("lease_expired", a),
        ("claimed", "worker-b"),
        ("lease_lost", a),
        ("sent", "worker-b"),
    ]
    delivery_key = row_of(db_conn, outbox_id)["delivery_key"]
    assert history[3].provider_message_id == f"scripted-{delivery_key}"
    assert history[3].lease_token == history[0].lease_token


async def test_a_queued_row_whose_lease_was_lost_is_released_not_sent(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    db_aconn: psycopg.AsyncConnection,
) -> None:
    blocker = db_insert(recipient="slow@example.com")
    queued = db_insert(recipient="queued@example.com")
    release = fake_provider.hold("slow@example.com")
    # One send slot: `queued` is claimed with the blocker and waits for the slot. A short
    # lease, so that A checks its leases several times a second.
    settings = replace(SETTINGS, concurrency=1, batch_size=2, lease_seconds=3)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    with log_records() as logged:
        async with running(worker):
            await fake_provider.held["slow@example.com"].wait()
            assert row_of(db_conn, queued)["status"] == "processing"
            later = fake_clock.now + timedelta(seconds=60)
            reclaimed = await sweeps.reclaim_expired_leases(
                db_aconn, default_max_attempts=8, now=later
            )
            assert {r.id for r in reclaimed} == {blocker, queued}
            taken = await claiming.claim(
                db_aconn, kinds=["otp"], limit=2, lease_seconds=45, worker_id="worker-b", now=later
            )
            tokens = {m.id: m.lease_token for m in taken}
            # A's next look at its leases finds this one gone, while the row still waits.
            await wait_for_async(
                lambda: logged.about(queued, LOST), what="logged.about(queued, LOST)", timeout=30
            )
            release.set()
            await wait_for_async(lambda: worker.held == 0, what="worker.held == 0")
    assert fake_provider.attempts["queued@example.com"] == 0
    for outbox_id in (blocker, queued):
        row = row_of(db_conn, outbox_id)
        assert (row["status"], row["leased_by"], row["lease_token"], row["attempts"]) == (
            "processing",
            "worker-b",
            tokens[outbox_id],
            2,
        )
    # The blocker's send was under way: its outcome is a lost lease. The queued row was
    # given back unsent, which is no outcome at all.
    assert worker.metrics.value("leasebox_lease_lost_total", {"kind": "otp"}) == 1
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 0


async def test_a_long_send_extends_its_lease_past_half_its_time(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(recipient="long@example.com")
    release = fake_provider.hold("long@example.com")
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, lease_seconds=1))
    async with running(worker):
        await fake_provider.held["long@example.com"].wait()
        fake_clock.advance(0.7)
        # A lease check every 0.25 s; half the lease is gone 0.5 s after the claim. Six more
        # checks (1.5 s) cover that moment whenever the send began.
        checks = worker.rounds["lease check"]
        await wait_for_async(
            lambda: worker.rounds["lease check"] >= checks + 6,
            what='worker.rounds["lease check"] >= checks + 6',
        )
        assert row_of(db_conn, outbox_id)["lease_expires_at"] == fake_clock.now + timedelta(
            seconds=1
        )
        release.set()
        await wait_for_async(
            lambda: row_of(db_conn, outbox_id)["status"] == "sent",
            what='row_of(db_conn, outbox_id)["status"] == "sent"',
        )
    assert worker.metrics.value("leasebox_lease_lost_total", {"kind": "otp"}) == 0
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 1


async def test_expired_leases_of_a_dead_worker_are_reclaimed_and_sent(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    db_aconn: psycopg.AsyncConnection,
) -> None:
    outbox_id = await _left_by_a_dead_worker(db_insert, db_aconn, fake_clock)
    worker = await _drained(db_pool, fake_provider, fake_clock)
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["attempts"], row["leased_by"]) == ("sent", 2, "test-worker")
    assert worker.metrics.value("leasebox_leases_reclaimed_total", {"kind": "otp"}) == 1


async def test_a_drain_waits_for_the_sweeper_taking_back_a_dead_workers_rows_and_sends_them(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    db_aconn: psycopg.AsyncConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outbox_id = await _left_by_a_dead_worker(db_insert, db_aconn, fake_clock)
    reclaim = sweeps.reclaim_expired_leases
    taken: list[int] = []
    sweeper_took = asyncio.Event()

    async def sweeper_first(conn: psycopg.AsyncConnection, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        if task is None or task.get_name() != "leasebox sweeper" or sweeper_took.is_set():
            async with asyncio.timeout(10):
                await sweeper_took.wait()
            return await reclaim(conn, **kwargs)
        # The sweeper's statement has taken the row back and not committed yet, as on a
        # loaded server: a sweep beside it passes over the locked row, a claim finds nothing.
        async with conn.transaction():
            rows = await reclaim(conn, **kwargs)
            taken.extend(row.id for row in rows)
            sweeper_took.set()
            await asyncio.sleep(0.5)
        return rows

    monkeypatch.setattr(sweeps, "reclaim_expired_leases", sweeper_first)
    worker = await _drained(db_pool, fake_provider, fake_clock)
    assert taken == [outbox_id]
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["attempts"], row["leased_by"]) == ("sent", 2, "test-worker")
    assert worker.metrics.value("leasebox_leases_reclaimed_total", {"kind": "otp"}) == 1


async def _left_by_a_dead_worker(
    db_insert: Insert, db_aconn: psycopg.AsyncConnection, fake_clock: ManualClock
) -> int:
    """A row claimed by a worker that died, its lease run out."""
    outbox_id = db_insert()
    await claiming.claim(
        db_aconn, kinds=["otp"], limit=1, lease_seconds=45, worker_id="died", now=fake_clock.now
    )
    fake_clock.advance(46)
    return outbox_id


async def _drained(
    db_pool: AsyncConnectionPool, fake_provider: ScriptedProvider, fake_clock: ManualClock
) -> Worker:
    """A `--drain` worker, run until it finds nothing more to do."""
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True))
    await worker.run()
    return worker
