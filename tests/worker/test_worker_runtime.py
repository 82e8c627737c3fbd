"""The worker runtime in-process, against a real PostgreSQL and a scripted provider.

Time moves through the injected clock (what the worker passes to SQL as `now`); the only
waits are for conditions (a row reaching a state, the worker having looked), never for a
duration. Backoff and expiry live in `test_backoff_and_expiry_while_running.py`, leases in
`test_leases_while_running.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from leasebox.db.partitions import Partition, day_partition_name, list_partitions
from leasebox.errors import ConfigurationError
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.worker import RESCAN_EVERY
from leasebox.store import claiming, settling
from leasebox.store.claiming import ClaimedMessage
from support.running_worker import SETTINGS, make_worker, running
from support.waiting import wait_for_async
from support.worker_doubles import Insert, ManualClock, ScriptedProvider, row_of, statuses


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


async def test_a_row_committed_behind_the_claims_is_sent_while_the_backlog_lasts(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
) -> None:
    start = fake_clock.now - timedelta(hours=1)
    backlog = [
        db_insert(recipient=f"r{i}@example.com", available_at=start + timedelta(minutes=i))
        for i in range(40)
    ]
    # One row a claim, one send at a time: every claim comes back full, so each reads on from
    # where the last one ended. With a poll interval far shorter than sixteen claims take, the
    # claim count alone says when one reads from the start.
    release = fake_provider.hold("r4@example.com")
    settings = replace(SETTINGS, concurrency=1, batch_size=1, drain=True, poll_interval=0.001)
    task = asyncio.get_running_loop().create_task(
        make_worker(db_pool, fake_provider, fake_clock, settings).run()
    )
    await fake_provider.held["r4@example.com"].wait()
    late = db_insert(available_at=fake_clock.now - timedelta(hours=2))  # behind every claim
    release.set()
    async with asyncio.timeout(30):
        await task
    order = [email.outbox_id for email in fake_provider.sent]
    assert sorted(order) == sorted([*backlog, late])
    # A rescan from the start found it while the backlog lasted, not the end of the backlog.
    assert order.index(late) < len(backlog)
    assert order.index(late) <= 6 + RESCAN_EVERY < len(backlog)


async def test_a_draining_worker_reads_from_the_start_no_more_than_once_a_poll_interval(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each read from the start walks the index entries of every row claimed since the last
    # vacuum: a long backlog must not pay for one every few claims.
    starts: list[bool] = []
    claim = claiming.claim

    async def counted(*args: Any, **kwargs: Any) -> list[ClaimedMessage]:
        starts.append(not kwargs["after"])
        return await claim(*args, **kwargs)

    monkeypatch.setattr(claiming, "claim", counted)
    backlog = [db_insert(recipient=f"r{i}@example.com") for i in range(3 * RESCAN_EVERY)]
    settings = replace(SETTINGS, concurrency=1, batch_size=1, drain=True, poll_interval=3600)
    async with asyncio.timeout(30):
        await make_worker(db_pool, fake_provider, fake_clock, settings).run()
    assert sorted(e.outbox_id for e in fake_provider.sent) == backlog
    # The first claim and the short ones at the end read from the start; the full claims in
    # between, three times `RESCAN_EVERY` of them, all read on from their cursor.
    assert starts[0]
    full = starts[1 : len(backlog)]
    assert len(full) == len(backlog) - 1
    assert not any(full)


async def test_a_short_claim_after_full_ones_drops_their_cursor_so_a_row_behind_it_is_sent(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
) -> None:
    # One row a claim: every claim that finds a row is full and moves the cursor past it.
    settings = replace(SETTINGS, concurrency=1, batch_size=1)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with running(worker):
        first = [db_insert(recipient=f"r{i}@example.com") for i in range(2)]
        await wait_for_async(
            lambda: len(fake_provider.sent) == 2, what="len(fake_provider.sent) == 2"
        )  # then a claim finds nothing
        late = db_insert(available_at=fake_clock.now - timedelta(hours=2))  # behind the cursor
        with contextlib.suppress(AssertionError):  # judged below: a worker that never sends it
            await wait_for_async(
                lambda: len(fake_provider.sent) == 3, what="len(fake_provider.sent) == 3", timeout=5
            )
    assert [email.outbox_id for email in fake_provider.sent] == [*first, late]


async def test_a_short_claim_forgets_its_cursor_so_the_next_claim_reads_from_the_start(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
) -> None:
    settings = replace(SETTINGS, concurrency=1)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with running(worker):
        first = [db_insert(recipient=f"r{i}@example.com") for i in range(2)]
        await wait_for_async(
            lambda: len(fake_provider.sent) == 2, what="len(fake_provider.sent) == 2"
        )  # a claim shorter than a batch
        late = db_insert(available_at=fake_clock.now - timedelta(hours=2))  # behind it
        new = db_insert()
        await wait_for_async(
            lambda: len(fake_provider.sent) == 4, what="len(fake_provider.sent) == 4"
        )
    order = [email.outbox_id for email in fake_provider.sent]
    assert order == [*first, late, new]


async def test_a_message_whose_outbox_row_is_gone_dead_letters_as_invalid_without_a_send(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    gone, kept = db_insert(), db_insert()
    db_conn.execute("DELETE FROM leasebox.outbox WHERE id = %s", (gone,))  # by hand
    db_conn.commit()
    await make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True)).run()
    row = db_conn.execute(
        "SELECT status, dead_reason, last_error_class FROM leasebox.queue WHERE id = %s", (gone,)
    ).fetchone()
    assert row == ("dead", "invalid_message", "missing_message")
    assert [email.outbox_id for email in fake_provider.sent] == [kept]


async def test_a_provider_that_reads_no_content_gets_its_messages_without_any(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
) -> None:
    outbox_id = db_insert(code="918273", aggregate_id="user-7")
    fake_provider.reads_content = False
    await make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True)).run()
    [email] = fake_provider.sent
    assert (email.outbox_id, email.aggregate_id, email.attempt) == (outbox_id, "user-7", 1)
    assert email.delivery_key == row_of(db_conn, outbox_id)["delivery_key"]
    assert (email.recipient, email.subject, email.text, email.html) == ("", "", "", None)


async def test_a_running_worker_creates_the_partitions_of_the_coming_days(
    db_dsn: str,
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_conn: psycopg.Connection,
) -> None:
    last = max(p.start for p in list_partitions(db_conn, "history") if p.start and p.end)
    db_conn.execute(
        sql.SQL("DROP TABLE {}").format(
            sql.Identifier("leasebox", day_partition_name("history", last))
        )
    )
    db_conn.commit()
    worker = make_worker(db_pool, fake_provider, fake_clock, dsn=db_dsn)
    async with running(worker):
        await wait_for_async(
            lambda: any(p.start == last for p in _partitions(db_conn, "history")),
            what='any(p.start == last for p in _partitions(db_conn, "history"))',
            timeout=30,
        )


def _partitions(conn: psycopg.Connection, table: str) -> list[Partition]:
    found = list_partitions(conn, table)
    conn.rollback()
    return found


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
    await wait_for_async(
        lambda: fake_provider.started_sends == 2 and worker.held == 4,
        what="fake_provider.started_sends == 2 and worker.held == 4",
    )
    worker.request_stop()
    # Queued rows go back before the sends in flight have finished.
    await wait_for_async(
        lambda: statuses(db_conn) == {"pending": 8, "processing": 2},
        what='statuses(db_conn) == {"pending": 8, "processing": 2}',
    )
    assert not task.done()
    fake_provider.hold_all.set()
    async with asyncio.timeout(10):
        await task
    assert statuses(db_conn) == {"pending": 8, "sent": 2}
    attempts = db_conn.execute(
        "SELECT DISTINCT attempts FROM leasebox.queue WHERE status = 'pending'"
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
    await wait_for_async(
        lambda: fake_provider.started_sends == 2, what="fake_provider.started_sends == 2"
    )
    worker.request_stop()
    worker.request_stop()
    async with asyncio.timeout(10):
        await task
    assert statuses(db_conn) == {"pending": 2}


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
        await wait_for_async(
            lambda: _listening(db_conn) and worker.rounds["claim"] >= 1,
            what='_listening(db_conn) and worker.rounds["claim"] >= 1',
        )
        claims = worker.rounds["claim"]
        outbox_id = db_insert()
        # The next poll is an hour away: only the NOTIFY can have made the worker claim.
        await wait_for_async(
            lambda: row_of(db_conn, outbox_id)["status"] == "sent",
            what='row_of(db_conn, outbox_id)["status"] == "sent"',
            timeout=60,
        )
    assert worker.rounds["claim"] - claims in (1, 2)  # the woken claim, and one that found none


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
    fake_provider.problem = None
    assert await worker.readiness_problem() is None


def test_settings_reject_contradictions() -> None:
    with pytest.raises(ConfigurationError, match="backoff maximum"):
        WorkerSettings(backoff_base=10, backoff_max=5)
    with pytest.raises(ConfigurationError, match="invalid kind"):
        WorkerSettings(kinds=("OTP",))
    with pytest.raises(ConfigurationError, match="concurrency"):
        WorkerSettings(concurrency=0)


async def test_rows_sent_but_not_yet_settled_free_their_slots_up_to_one_batch_more(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in range(40):
        db_insert()
    writable = asyncio.Event()
    mark_sent = settling.mark_sent

    async def stalled(conn: psycopg.AsyncConnection, *args: Any, **options: Any) -> Any:
        await writable.wait()
        return await mark_sent(conn, *args, **options)

    monkeypatch.setattr(settling, "mark_sent", stalled)
    settings = replace(SETTINGS, concurrency=2, batch_size=3)  # capacity 5
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with running(worker):
        # The sends finish, their outcomes cannot be written: the worker claims on while the
        # rows it holds only wait for their statement, then stops at a batch beyond capacity.
        await wait_for_async(
            lambda: len(fake_provider.sent) >= 5, what="len(fake_provider.sent) >= 5"
        )
        with contextlib.suppress(AssertionError):  # judged below: a worker that stops short
            await wait_for_async(
                lambda: len(fake_provider.sent) >= 8, what="len(fake_provider.sent) >= 8", timeout=5
            )
        held, sent = statuses(db_conn), len(fake_provider.sent)
        writable.set()
        await wait_for_async(
            lambda: statuses(db_conn) == {"sent": 40}, what='statuses(db_conn) == {"sent": 40}'
        )
    assert (held, sent) == ({"processing": 8, "pending": 32}, 8)


async def test_a_backlog_is_claimed_at_least_half_a_batch_at_a_time(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = [db_insert(kind="otp", template="otp") for _ in range(60)]
    limits: list[tuple[int, int]] = []
    claim = claiming.claim

    async def recorded(conn: psycopg.AsyncConnection, **options: Any) -> list[ClaimedMessage]:
        rows = await claim(conn, **options)
        limits.append((options["limit"], len(rows)))
        return rows

    monkeypatch.setattr(claiming, "claim", recorded)
    settings = replace(SETTINGS, drain=True, concurrency=2, batch_size=10)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with asyncio.timeout(20):
        await worker.run()

    assert sorted(e.outbox_id for e in fake_provider.sent) == ids
    assert statuses(db_conn) == {"sent": 60}
    found = [(limit, got) for limit, got in limits if got]
    assert sum(got for _, got in found) == 60
    # Capacity is 12 (2 sending, 10 waiting): claiming whatever a settled row freed would ask
    # for 1 or 2 rows at a time; while rows remain, every claim asks for 5 or more.
    assert all(limit >= 5 for limit, _ in found), limits
