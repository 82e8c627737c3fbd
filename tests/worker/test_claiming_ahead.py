"""The second claimer: during a backlog a worker has two claims in flight, never more.

The claims are the real statement against a real PostgreSQL, recorded as they start and end
(`claiming.claim` wrapped), so what is checked is what the worker asks of the database: how
many claims at once, whether an idle worker still polls one at a time, and that a stop never
strands the rows of a claim that was still running.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.store import claiming
from leasebox.store.claiming import ClaimedMessage
from support.running_worker import SETTINGS, make_worker, running
from support.waiting import wait_for_async
from support.worker_doubles import Insert, ManualClock, ScriptedProvider, statuses


@dataclass
class Claims:
    """The claims the worker sent: how many ran at once, at most, and their sizes."""

    running: int = 0
    most_at_once: int = 0
    started: int = 0
    taken: list[int] = field(default_factory=list)
    # When set, the first second claim at once waits for `go` before it reaches the database;
    # `late` is what it took.
    hold_second: bool = False
    second_waiting: asyncio.Event = field(default_factory=asyncio.Event)
    go: asyncio.Event = field(default_factory=asyncio.Event)
    late: list[int] = field(default_factory=list)


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> Claims:
    seen = Claims()
    claim = claiming.claim

    async def recorded(conn: psycopg.AsyncConnection, **options: Any) -> list[ClaimedMessage]:
        seen.running += 1
        seen.started += 1
        seen.most_at_once = max(seen.most_at_once, seen.running)
        held = seen.hold_second and seen.running == 2
        try:
            if held:
                seen.hold_second = False
                seen.second_waiting.set()
                await seen.go.wait()
            rows = await claim(conn, **options)
            seen.taken.append(len(rows))
            if held:
                seen.late = [message.id for message in rows]
            return rows
        finally:
            seen.running -= 1

    monkeypatch.setattr(claiming, "claim", recorded)
    return seen


async def test_a_backlog_is_claimed_two_claims_at_a_time_and_each_row_is_sent_once(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    claims: Claims,
) -> None:
    ids = [db_insert() for _ in range(120)]
    settings = replace(SETTINGS, drain=True, concurrency=40, batch_size=10)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with asyncio.timeout(30):
        await worker.run()
    assert claims.most_at_once == 2
    assert sorted(e.outbox_id for e in fake_provider.sent) == ids
    assert statuses(db_conn) == {"sent": 120}
    assert sum(claims.taken) == 120
    assert worker.held == 0


async def test_an_idle_worker_polls_one_claim_at_a_time(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    claims: Claims,
) -> None:
    ids = [db_insert() for _ in range(3)]  # fewer than a batch: no backlog
    settings = replace(SETTINGS, concurrency=40, batch_size=10)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with running(worker):
        await wait_for_async(lambda: claims.started >= 10, what="claims.started >= 10")
    assert claims.most_at_once == 1
    assert sorted(e.outbox_id for e in fake_provider.sent) == ids
    assert statuses(db_conn) == {"sent": 3}


async def test_a_stop_while_a_second_claim_runs_releases_the_rows_it_brings(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    claims: Claims,
) -> None:
    for _ in range(100):
        db_insert()
    claims.hold_second = True
    settings = replace(SETTINGS, concurrency=40, batch_size=10)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with running(worker) as task:
        await wait_for_async(claims.second_waiting.is_set, what="a second claim in flight")
        worker.request_stop()
        claims.go.set()  # it reaches the database after the stop, and takes its rows
        async with asyncio.timeout(30):
            await task
    sent = {e.outbox_id for e in fake_provider.sent}
    # No row is left leased: what the stopped worker did not send is pending again at once,
    # the rows of the claim that landed after the stop among them.
    assert statuses(db_conn) == {"sent": len(sent), "pending": 100 - len(sent)}
    assert len(sent) == len(fake_provider.sent)
    assert len(claims.late) == 10
    assert not sent & set(claims.late)
    assert {status_of(db_conn, i) for i in claims.late} == {"pending"}
    assert worker.held == 0


def status_of(conn: psycopg.Connection, outbox_id: int) -> str:
    row = conn.execute(
        "SELECT status FROM leasebox.messages WHERE id = %s", (outbox_id,)
    ).fetchone()
    conn.rollback()
    assert row is not None
    return str(row[0])
