"""Backoff and expiry in the running worker, against a real PostgreSQL.

The pure curve is tested in `test_retrying.py`; here the worker itself must use it: the
attempt it passes, the cap from its settings, the attempt limit of the row. Expiry is
checked on the injected clock and on the production one, where the worker's idea of the
database's time is the claim's timestamp plus the time elapsed since.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox.runtime.worker import database_clock
from support.running_worker import SETTINGS, make_worker, no_jitter, running
from support.waiting import wait_for_async
from support.worker_doubles import Insert, ManualClock, ScriptedProvider, row_of


def _settled(conn: psycopg.Connection, outbox_id: int, attempts: int) -> bool:
    """Whether attempt number `attempts` of the row is over and its outcome written."""
    row = row_of(conn, outbox_id)
    return bool(row["attempts"] == attempts and row["status"] != "processing")


async def test_a_transient_failure_is_retried_after_its_backoff(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(recipient="flaky@example.com")
    fake_provider.transient_failures["flaky@example.com"] = 1
    worker = make_worker(db_pool, fake_provider, fake_clock)
    async with running(worker):
        await wait_for_async(
            lambda: row_of(db_conn, outbox_id)["last_error_class"] == "smtp_451",
            what='row_of(db_conn, outbox_id)["last_error_class"] == "smtp_451"',
        )
        row = row_of(db_conn, outbox_id)
        # rng() == 0 draws the bottom of the jitter range: half of base * 2**0.
        assert row["available_at"] == fake_clock.now + timedelta(seconds=1.0)
        assert (row["status"], row["attempts"]) == ("pending", 1)
        fake_clock.advance(0.9)
        # Two claims after the clock moved: the second began after it, and found nothing.
        claims = worker.rounds["claim"]
        await wait_for_async(
            lambda: worker.rounds["claim"] >= claims + 2,
            what='worker.rounds["claim"] >= claims + 2',
        )
        assert row_of(db_conn, outbox_id)["status"] == "pending"
        fake_clock.advance(0.2)
        await wait_for_async(
            lambda: row_of(db_conn, outbox_id)["status"] == "sent",
            what='row_of(db_conn, outbox_id)["status"] == "sent"',
        )
    assert row_of(db_conn, outbox_id)["attempts"] == 2
    assert fake_provider.attempts["flaky@example.com"] == 2
    labels = {"kind": "otp", "error_class": "smtp_451"}
    assert worker.metrics.value("leasebox_retries_total", labels) == 1
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 1


async def test_the_running_worker_backs_off_1_2_4_seconds_then_stays_at_the_cap(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(recipient="down@example.com", max_attempts=20)
    fake_provider.transient_failures["down@example.com"] = 99
    settings = replace(SETTINGS, backoff_base=1, backoff_max=5)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings, rng=no_jitter)
    gaps = []
    async with running(worker):
        for attempt in range(1, 7):
            await wait_for_async(
                lambda: _settled(db_conn, outbox_id, attempt),  # noqa: B023
                what="_settled(db_conn, outbox_id, attempt)",
            )
            row = row_of(db_conn, outbox_id)
            assert row["status"] == "pending", row["status"]
            gap = (row["available_at"] - fake_clock.now).total_seconds()
            gaps.append(gap)
            fake_clock.advance(gap)  # ready again exactly when the backoff ends
    assert gaps == [1, 2, 4, 5, 5, 5]
    labels = {"kind": "otp", "error_class": "smtp_451"}
    assert worker.metrics.value("leasebox_retries_total", labels) >= 6


async def test_transient_failures_dead_letter_once_attempts_run_out(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    # The row's own limit (3) wins over the worker's (8).
    outbox_id = db_insert(recipient="down@example.com", max_attempts=3)
    fake_provider.transient_failures["down@example.com"] = 99
    worker = make_worker(db_pool, fake_provider, fake_clock)
    async with running(worker):
        for attempt in (1, 2, 3):
            await wait_for_async(
                lambda: _settled(db_conn, outbox_id, attempt),  # noqa: B023
                what="_settled(db_conn, outbox_id, attempt)",
            )
            fake_clock.advance(600)
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"], row["attempts"]) == (
        "dead",
        "attempts_exhausted",
        3,
    )
    assert fake_provider.attempts["down@example.com"] == 3
    labels = {"kind": "otp", "reason": "attempts_exhausted"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1


async def test_an_otp_that_expires_while_claimed_is_dead_lettered_never_sent(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    blocker = db_insert(recipient="slow@example.com")
    otp = db_insert(recipient="late@example.com", expires_at=fake_clock.now + timedelta(seconds=30))
    release = fake_provider.hold("slow@example.com")
    # One send slot: the OTP waits, claimed, behind the held send while its TTL runs out.
    settings = replace(SETTINGS, concurrency=1, batch_size=2)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with running(worker):
        await wait_for_async(
            lambda: row_of(db_conn, otp)["status"] == "processing",
            what='row_of(db_conn, otp)["status"] == "processing"',
        )
        await fake_provider.held["slow@example.com"].wait()
        fake_clock.advance(31)
        release.set()
        await wait_for_async(
            lambda: row_of(db_conn, otp)["status"] in ("dead", "sent"),
            what='row_of(db_conn, otp)["status"] in ("dead", "sent")',
        )
        await wait_for_async(
            lambda: row_of(db_conn, blocker)["status"] == "sent",
            what='row_of(db_conn, blocker)["status"] == "sent"',
        )
    assert (row_of(db_conn, otp)["status"], row_of(db_conn, otp)["dead_reason"]) == (
        "dead",
        "expired",
    )
    assert fake_provider.attempts["late@example.com"] == 0
    labels = {"kind": "otp", "reason": "expired"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1


def _database_time(conn: psycopg.Connection) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    conn.rollback()
    assert row is not None
    value: datetime = row[0]
    return value


async def test_on_the_production_clock_an_otp_stuck_behind_a_blocked_send_expires_unsent(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    blocker = db_insert(recipient="slow@example.com")
    release = fake_provider.hold("slow@example.com")
    # One send slot, the database's own clock: nothing about time is injected here.
    settings = replace(SETTINGS, concurrency=1, batch_size=2)
    worker = make_worker(db_pool, fake_provider, database_clock, settings)
    async with running(worker):
        await fake_provider.held["slow@example.com"].wait()
        expires_at = _database_time(db_conn) + timedelta(seconds=2)
        otp = db_insert(recipient="late@example.com", expires_at=expires_at)
        await wait_for_async(
            lambda: row_of(db_conn, otp)["status"] == "processing",
            what='row_of(db_conn, otp)["status"] == "processing"',
        )
        # Claimed while still valid, so the claim's timestamp alone says "not expired".
        assert row_of(db_conn, otp)["updated_at"] < expires_at
        await wait_for_async(
            lambda: _database_time(db_conn) > expires_at,
            what="_database_time(db_conn) > expires_at",
            timeout=60,
        )
        release.set()
        await wait_for_async(
            lambda: row_of(db_conn, otp)["status"] != "processing",
            what='row_of(db_conn, otp)["status"] != "processing"',
        )
        await wait_for_async(
            lambda: row_of(db_conn, blocker)["status"] == "sent",
            what='row_of(db_conn, blocker)["status"] == "sent"',
        )
    row = row_of(db_conn, otp)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "expired", 1)
    assert fake_provider.attempts["late@example.com"] == 0
    labels = {"kind": "otp", "reason": "expired"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1
