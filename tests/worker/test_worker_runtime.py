"""The worker runtime in-process, against a real PostgreSQL and a scripted provider.

Time moves through the injected clock (what the worker passes to SQL as `now`); the only
waits are for conditions (a row reaching a state), never for a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.rendering import TemplateRenderer
from leasebox.errors import ConfigurationError
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.worker import Worker
from leasebox.store import claiming, settling, sweeps
from leasebox.store.claiming import LeaseRef
from leasebox.store.settling import Sent
from support.worker_doubles import (
    Insert,
    ManualClock,
    ScriptedProvider,
    eventually,
    row_of,
    statuses,
)

SETTINGS = WorkerSettings(
    kinds=("otp", "invite"),
    concurrency=4,
    batch_size=4,
    lease_seconds=45,
    poll_interval=0.02,
    listen=False,
    grace_seconds=5,
    worker_id="test-worker",
)


def make_worker(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    settings: WorkerSettings = SETTINGS,
    dsn: str | None = None,
) -> Worker:
    return Worker(
        settings,
        db_pool,
        fake_provider,
        TemplateRenderer(),
        dsn=dsn,
        clock=fake_clock,
        rng=lambda: 0.0,
    )


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield task
    finally:
        worker.request_stop()
        async with asyncio.timeout(10):
            await task


async def test_drain_mode_sends_every_ready_row_once_then_exits(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    ids = [db_insert(kind="otp" if i % 2 else "invite", template="otp") for i in range(30)]
    db_insert(kind="newsletter", template="otp")  # not this worker's kind
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True))
    async with asyncio.timeout(20):
        await worker.run()
    assert sorted(e.outbox_id for e in fake_provider.sent) == ids
    assert statuses(db_conn) == {"sent": 30, "pending": 1}
    row = row_of(db_conn, ids[0])
    assert row["provider_message_id"] == f"scripted-{row['delivery_key']}"
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 15
    assert worker.metrics.value("leasebox_claimed_total", {"kind": "invite"}) == 15
    assert worker.metrics.value("leasebox_delivery_latency_seconds_count", {"kind": "otp"}) == 15
    assert worker.metrics.value("leasebox_send_duration_seconds_count", {"kind": "otp"}) == 15
    assert worker.metrics.value("leasebox_inflight_sends") == 0
    assert worker.held == 0


async def test_the_rendered_email_carries_the_code_and_the_delivery_key(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(code="918273", aggregate_id="user-42")
    await make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True)).run()
    [email] = fake_provider.sent
    assert "918273" in email.text
    assert email.delivery_key == row_of(db_conn, outbox_id)["delivery_key"]
    assert (email.outbox_id, email.aggregate_id, email.attempt) == (outbox_id, "user-42", 1)


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
        await eventually(lambda: row_of(db_conn, outbox_id)["last_error_class"] == "smtp_451")
        row = row_of(db_conn, outbox_id)
        # rng() == 0 draws the bottom of the jitter range: half of base * 2**0.
        assert row["available_at"] == fake_clock.now + timedelta(seconds=1.0)
        assert (row["status"], row["attempts"]) == ("pending", 1)
        fake_clock.advance(0.9)
        await asyncio.sleep(0.1)  # several polls: nothing may be claimed before the backoff
        assert row_of(db_conn, outbox_id)["status"] == "pending"
        fake_clock.advance(0.2)
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "sent")
    assert row_of(db_conn, outbox_id)["attempts"] == 2
    assert fake_provider.attempts["flaky@example.com"] == 2
    labels = {"kind": "otp", "error_class": "smtp_451"}
    assert worker.metrics.value("leasebox_retries_total", labels) == 1
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 1


async def test_a_permanent_failure_dead_letters_after_one_attempt(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(recipient="nobody@example.com")
    fake_provider.rejected.add("nobody@example.com")
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True))
    await worker.run()
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "rejected", 1)
    assert row["last_error_class"] == "smtp_550"
    assert fake_provider.attempts["nobody@example.com"] == 1
    labels = {"kind": "otp", "reason": "rejected"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1


async def test_a_missing_template_dead_letters_as_an_invalid_message_without_a_send(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(template="no-such-template")
    await make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True)).run()
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"], row["last_error_class"]) == (
        "dead",
        "invalid_message",
        "template",
    )
    assert fake_provider.started_sends == 0


async def test_transient_failures_dead_letter_once_attempts_run_out(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(recipient="down@example.com", max_attempts=3)
    fake_provider.transient_failures["down@example.com"] = 99
    worker = make_worker(db_pool, fake_provider, fake_clock)
    async with running(worker):
        for attempt in (1, 2):
            await eventually(lambda: row_of(db_conn, outbox_id)["attempts"] == attempt)  # noqa: B023
            await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "pending")
            fake_clock.advance(600)
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "dead")
    row = row_of(db_conn, outbox_id)
    assert (row["dead_reason"], row["attempts"]) == ("attempts_exhausted", 3)
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
        await eventually(lambda: row_of(db_conn, otp)["status"] == "processing")
        await fake_provider.held["slow@example.com"].wait()
        fake_clock.advance(31)
        release.set()
        await eventually(lambda: row_of(db_conn, otp)["status"] in ("dead", "sent"))
        await eventually(lambda: row_of(db_conn, blocker)["status"] == "sent")
    assert (row_of(db_conn, otp)["status"], row_of(db_conn, otp)["dead_reason"]) == (
        "dead",
        "expired",
    )
    assert fake_provider.attempts["late@example.com"] == 0
    labels = {"kind": "otp", "reason": "expired"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1


async def test_a_worker_stalled_past_its_lease_cannot_mark_the_row_sent(
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
        # The stall: time passes beyond the lease while the send hangs. Another worker
        # reclaims the row, sends it and marks it sent under its own lease.
        later = fake_clock.now + timedelta(seconds=60)
        assert await sweeps.reclaim_expired_leases(db_aconn, default_max_attempts=8, now=later)
        [taken] = await claiming.claim(
            db_aconn, kinds=["otp"], limit=1, lease_seconds=45, worker_id="worker-b", now=later
        )
        lease = LeaseRef(taken.id, taken.lease_token)
        assert await settling.mark_sent(db_aconn, [Sent(lease, "from-b")], now=later)
        fake_clock.now = later
        release.set()
        await eventually(
            lambda: worker.metrics.value("leasebox_lease_lost_total", {"kind": "otp"}) == 1
        )
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["provider_message_id"], row["leased_by"]) == (
        "sent",
        "from-b",
        "worker-b",
    )
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 0


async def test_stopping_releases_queued_rows_at_once_and_lets_sends_in_flight_finish(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    for _ in range(10):
        db_insert()
    fake_provider.hold_all = asyncio.Event()
    settings = replace(SETTINGS, concurrency=2, batch_size=2)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    task = asyncio.get_running_loop().create_task(worker.run())
    await eventually(lambda: fake_provider.started_sends == 2 and worker.held == 4)
    worker.request_stop()
    # Queued rows go back before the sends in flight have finished.
    await eventually(lambda: statuses(db_conn) == {"pending": 8, "processing": 2})
    assert not task.done()
    fake_provider.hold_all.set()
    async with asyncio.timeout(10):
        await task
    assert statuses(db_conn) == {"pending": 8, "sent": 2}
    attempts = db_conn.execute(
        "SELECT DISTINCT attempts FROM leasebox.outbox WHERE status = 'pending'"
    ).fetchall()
    assert attempts == [(0,)]


async def test_a_second_stop_request_cancels_the_sends_in_flight_and_releases_them(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    for _ in range(2):
        db_insert()
    fake_provider.hold_all = asyncio.Event()
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, grace_seconds=300))
    task = asyncio.get_running_loop().create_task(worker.run())
    await eventually(lambda: fake_provider.started_sends == 2)
    worker.request_stop()
    worker.request_stop()
    async with asyncio.timeout(10):
        await task
    assert statuses(db_conn) == {"pending": 2}


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
        first = row_of(db_conn, outbox_id)["lease_expires_at"]
        fake_clock.advance(0.7)
        await eventually(lambda: row_of(db_conn, outbox_id)["lease_expires_at"] > first)
        assert row_of(db_conn, outbox_id)["lease_expires_at"] == fake_clock.now + timedelta(
            seconds=1
        )
        release.set()
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "sent")
    assert worker.metrics.value("leasebox_lease_lost_total", {"kind": "otp"}) == 0


async def test_expired_leases_of_a_dead_worker_are_reclaimed_and_sent(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    db_aconn: psycopg.AsyncConnection,
) -> None:
    outbox_id = db_insert()
    await claiming.claim(
        db_aconn, kinds=["otp"], limit=1, lease_seconds=45, worker_id="died", now=fake_clock.now
    )
    fake_clock.advance(46)
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True))
    await worker.run()
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["attempts"], row["leased_by"]) == ("sent", 2, "test-worker")
    assert worker.metrics.value("leasebox_leases_reclaimed_total", {"kind": "otp"}) == 1


async def test_a_notify_wakes_an_idle_worker_long_before_its_poll(
    db_dsn: str,
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    settings = replace(SETTINGS, listen=True, poll_interval=3600)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings, dsn=db_dsn)
    async with running(worker):
        await eventually(lambda: _listening(db_conn))
        outbox_id = db_insert()
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "sent", within=5)


def _listening(conn: psycopg.Connection) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        ("leasebox-worker-listen",),
    ).fetchone()
    conn.rollback()
    return bool(row and row[0])


async def test_readiness_reports_a_provider_problem_and_then_recovers(
    db_pool: AsyncConnectionPool, fake_provider: ScriptedProvider, fake_clock: ManualClock
) -> None:
    worker = make_worker(db_pool, fake_provider, fake_clock)
    assert await worker.readiness_problem() is None
    fake_provider.problem = "smtp server refused the connection"
    assert await worker.readiness_problem() == "provider: smtp server refused the connection"


def test_settings_reject_contradictions() -> None:
    with pytest.raises(ConfigurationError, match="backoff maximum"):
        WorkerSettings(backoff_base=10, backoff_max=5)
    with pytest.raises(ConfigurationError, match="invalid kind"):
        WorkerSettings(kinds=("OTP",))
    with pytest.raises(ConfigurationError, match="concurrency"):
        WorkerSettings(concurrency=0)
