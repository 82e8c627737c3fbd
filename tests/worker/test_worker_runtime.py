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
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    settings: WorkerSettings = SETTINGS,
    dsn: str | None = None,
) -> Worker:
    return Worker(
        settings, pool, provider, TemplateRenderer(), dsn=dsn, clock=clock, rng=lambda: 0.0
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
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    ids = [insert(kind="otp" if i % 2 else "invite", template="otp") for i in range(30)]
    insert(kind="newsletter", template="otp")  # not this worker's kind
    worker = make_worker(pool, provider, clock, replace(SETTINGS, drain=True))
    async with asyncio.timeout(20):
        await worker.run()
    assert sorted(e.outbox_id for e in provider.sent) == ids
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
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = insert(code="918273", aggregate_id="user-42")
    await make_worker(pool, provider, clock, replace(SETTINGS, drain=True)).run()
    [email] = provider.sent
    assert "918273" in email.text
    assert email.delivery_key == row_of(db_conn, outbox_id)["delivery_key"]
    assert (email.outbox_id, email.aggregate_id, email.attempt) == (outbox_id, "user-42", 1)


async def test_a_transient_failure_is_retried_after_its_backoff(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = insert(recipient="flaky@example.com")
    provider.transient_failures["flaky@example.com"] = 1
    worker = make_worker(pool, provider, clock)
    async with running(worker):
        await eventually(lambda: row_of(db_conn, outbox_id)["last_error_class"] == "smtp_451")
        row = row_of(db_conn, outbox_id)
        # rng() == 0 draws the bottom of the jitter range: half of base * 2**0.
        assert row["available_at"] == clock.now + timedelta(seconds=1.0)
        assert (row["status"], row["attempts"]) == ("pending", 1)
        clock.advance(0.9)
        await asyncio.sleep(0.1)  # several polls: nothing may be claimed before the backoff
        assert row_of(db_conn, outbox_id)["status"] == "pending"
        clock.advance(0.2)
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "sent")
    assert row_of(db_conn, outbox_id)["attempts"] == 2
    assert provider.attempts["flaky@example.com"] == 2
    labels = {"kind": "otp", "error_class": "smtp_451"}
    assert worker.metrics.value("leasebox_retries_total", labels) == 1
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 1


async def test_a_permanent_failure_dead_letters_after_one_attempt(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = insert(recipient="nobody@example.com")
    provider.rejected.add("nobody@example.com")
    worker = make_worker(pool, provider, clock, replace(SETTINGS, drain=True))
    await worker.run()
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "rejected", 1)
    assert row["last_error_class"] == "smtp_550"
    assert provider.attempts["nobody@example.com"] == 1
    labels = {"kind": "otp", "reason": "rejected"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1


async def test_a_missing_template_dead_letters_as_an_invalid_message_without_a_send(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = insert(template="no-such-template")
    await make_worker(pool, provider, clock, replace(SETTINGS, drain=True)).run()
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"], row["last_error_class"]) == (
        "dead",
        "invalid_message",
        "template",
    )
    assert provider.started_sends == 0


async def test_transient_failures_dead_letter_once_attempts_run_out(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = insert(recipient="down@example.com", max_attempts=3)
    provider.transient_failures["down@example.com"] = 99
    worker = make_worker(pool, provider, clock)
    async with running(worker):
        for attempt in (1, 2):
            await eventually(lambda: row_of(db_conn, outbox_id)["attempts"] == attempt)  # noqa: B023
            await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "pending")
            clock.advance(600)
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "dead")
    row = row_of(db_conn, outbox_id)
    assert (row["dead_reason"], row["attempts"]) == ("attempts_exhausted", 3)
    assert provider.attempts["down@example.com"] == 3
    labels = {"kind": "otp", "reason": "attempts_exhausted"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1


async def test_an_otp_that_expires_while_claimed_is_dead_lettered_never_sent(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    blocker = insert(recipient="slow@example.com")
    otp = insert(recipient="late@example.com", expires_at=clock.now + timedelta(seconds=30))
    release = provider.hold("slow@example.com")
    # One send slot: the OTP waits, claimed, behind the held send while its TTL runs out.
    settings = replace(SETTINGS, concurrency=1, batch_size=2)
    worker = make_worker(pool, provider, clock, settings)
    async with running(worker):
        await eventually(lambda: row_of(db_conn, otp)["status"] == "processing")
        await provider.held["slow@example.com"].wait()
        clock.advance(31)
        release.set()
        await eventually(lambda: row_of(db_conn, otp)["status"] == "dead")
        await eventually(lambda: row_of(db_conn, blocker)["status"] == "sent")
    assert row_of(db_conn, otp)["dead_reason"] == "expired"
    assert provider.attempts["late@example.com"] == 0
    labels = {"kind": "otp", "reason": "expired"}
    assert worker.metrics.value("leasebox_dead_letters_total", labels) == 1


async def test_a_worker_stalled_past_its_lease_cannot_mark_the_row_sent(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
    aconn: psycopg.AsyncConnection,
) -> None:
    outbox_id = insert(recipient="stall@example.com")
    release = provider.hold("stall@example.com")
    worker = make_worker(pool, provider, clock)
    async with running(worker):
        await provider.held["stall@example.com"].wait()
        # The stall: time passes beyond the lease while the send hangs. Another worker
        # reclaims the row, sends it and marks it sent under its own lease.
        later = clock.now + timedelta(seconds=60)
        assert await sweeps.reclaim_expired_leases(aconn, default_max_attempts=8, now=later)
        [taken] = await claiming.claim(
            aconn, kinds=["otp"], limit=1, lease_seconds=45, worker_id="worker-b", now=later
        )
        lease = LeaseRef(taken.id, taken.lease_token)
        assert await settling.mark_sent(aconn, [Sent(lease, "from-b")], now=later)
        clock.now = later
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
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    for _ in range(10):
        insert()
    provider.hold_all = asyncio.Event()
    settings = replace(SETTINGS, concurrency=2, batch_size=2)
    worker = make_worker(pool, provider, clock, settings)
    task = asyncio.get_running_loop().create_task(worker.run())
    await eventually(lambda: provider.started_sends == 2 and worker.held == 4)
    worker.request_stop()
    # Queued rows go back before the sends in flight have finished.
    await eventually(lambda: statuses(db_conn) == {"pending": 8, "processing": 2})
    assert not task.done()
    provider.hold_all.set()
    async with asyncio.timeout(10):
        await task
    assert statuses(db_conn) == {"pending": 8, "sent": 2}
    attempts = db_conn.execute(
        "SELECT DISTINCT attempts FROM leasebox.outbox WHERE status = 'pending'"
    ).fetchall()
    assert attempts == [(0,)]


async def test_a_second_stop_request_cancels_the_sends_in_flight_and_releases_them(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    for _ in range(2):
        insert()
    provider.hold_all = asyncio.Event()
    worker = make_worker(pool, provider, clock, replace(SETTINGS, grace_seconds=300))
    task = asyncio.get_running_loop().create_task(worker.run())
    await eventually(lambda: provider.started_sends == 2)
    worker.request_stop()
    worker.request_stop()
    async with asyncio.timeout(10):
        await task
    assert statuses(db_conn) == {"pending": 2}


async def test_a_long_send_extends_its_lease_past_half_its_time(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = insert(recipient="long@example.com")
    release = provider.hold("long@example.com")
    worker = make_worker(pool, provider, clock, replace(SETTINGS, lease_seconds=1))
    async with running(worker):
        await provider.held["long@example.com"].wait()
        first = row_of(db_conn, outbox_id)["lease_expires_at"]
        clock.advance(0.7)
        await eventually(lambda: row_of(db_conn, outbox_id)["lease_expires_at"] > first)
        assert row_of(db_conn, outbox_id)["lease_expires_at"] == clock.now + timedelta(seconds=1)
        release.set()
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "sent")
    assert worker.metrics.value("leasebox_lease_lost_total", {"kind": "otp"}) == 0


async def test_expired_leases_of_a_dead_worker_are_reclaimed_and_sent(
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
    aconn: psycopg.AsyncConnection,
) -> None:
    outbox_id = insert()
    await claiming.claim(
        aconn, kinds=["otp"], limit=1, lease_seconds=45, worker_id="died", now=clock.now
    )
    clock.advance(46)
    worker = make_worker(pool, provider, clock, replace(SETTINGS, drain=True))
    await worker.run()
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["attempts"], row["leased_by"]) == ("sent", 2, "test-worker")
    assert worker.metrics.value("leasebox_leases_reclaimed_total", {"kind": "otp"}) == 1


async def test_a_notify_wakes_an_idle_worker_long_before_its_poll(
    db_dsn: str,
    pool: AsyncConnectionPool,
    provider: ScriptedProvider,
    clock: ManualClock,
    insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    settings = replace(SETTINGS, listen=True, poll_interval=3600)
    worker = make_worker(pool, provider, clock, settings, dsn=db_dsn)
    async with running(worker):
        await eventually(lambda: _listening(db_conn))
        outbox_id = insert()
        await eventually(lambda: row_of(db_conn, outbox_id)["status"] == "sent", within=5)


def _listening(conn: psycopg.Connection) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        ("leasebox-worker-listen",),
    ).fetchone()
    conn.rollback()
    return bool(row and row[0])


async def test_readiness_reports_a_provider_problem_and_then_recovers(
    pool: AsyncConnectionPool, provider: ScriptedProvider, clock: ManualClock
) -> None:
    worker = make_worker(pool, provider, clock)
    assert await worker.readiness_problem() is None
    provider.problem = "smtp server refused the connection"
    assert await worker.readiness_problem() == "provider: smtp server refused the connection"


def test_settings_reject_contradictions() -> None:
    with pytest.raises(ConfigurationError, match="backoff maximum"):
        WorkerSettings(backoff_base=10, backoff_max=5)
    with pytest.raises(ConfigurationError, match="invalid kind"):
        WorkerSettings(kinds=("OTP",))
    with pytest.raises(ConfigurationError, match="concurrency"):
        WorkerSettings(concurrency=0)
