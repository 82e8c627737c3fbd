"""The history costs no round trip: a claim, a settled batch and a sweep send the statements
they sent before the history existed, one per claim and one per kind of outcome.

Statements are counted at the client: every connection's cursors are wrapped, so any
statement the store or the runtime sends is seen, and named by the query it is.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox.runtime import upkeep
from leasebox.runtime.completion import Completion, CompletionBatcher
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.runtime.settings import WorkerSettings
from leasebox.states import DeadReason
from leasebox.store import claiming
from leasebox.store.claiming import LeaseRef
from leasebox.store.settling import Dead, Release, Retry, Sent
from support.counted_statements import Statements
from support.history import events, histories
from support.worker_doubles import Insert, ManualClock

WORKER = "worker-counted"


async def settle(pool: AsyncConnectionPool, now: datetime, *completions: Completion) -> list[int]:
    """Write `completions` through the completion batcher as one batch; the ids it settled."""
    settled: list[int] = []
    batcher = CompletionBatcher(
        pool,
        WorkerMetrics(),
        schema="leasebox",
        clock=lambda: now,
        on_settled=settled.append,
        lease_deadline=lambda _: time.monotonic() + 60,
        worker_id=WORKER,
    )
    for completion in completions:
        batcher.put(completion)
    flusher = asyncio.get_running_loop().create_task(batcher.run())
    await batcher.close()
    await flusher
    return settled


async def test_a_claim_is_still_one_statement_with_its_history(
    counted_pool: AsyncConnectionPool,
    statements: Statements,
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    ids = [db_insert() for _ in range(5)]
    async with counted_pool.connection() as conn:
        claimed = await claiming.claim(
            conn, kinds=["otp"], limit=10, lease_seconds=45, worker_id=WORKER, now=db_now
        )
    assert statements.take() == ["claim"]
    assert sorted(m.id for m in claimed) == sorted(ids)
    assert {i: events(rows) for i, rows in histories(db_conn).items()} == {
        i: ["claimed"] for i in ids
    }


async def test_a_settled_batch_sends_one_statement_per_kind_of_outcome(
    counted_pool: AsyncConnectionPool,
    statements: Statements,
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    ids = [db_insert() for _ in range(6)]
    async with counted_pool.connection() as conn:
        m = await claiming.claim(
            conn, kinds=["otp"], limit=10, lease_seconds=45, worker_id=WORKER, now=db_now
        )
    statements.take()
    stale = LeaseRef(m[5].id, uuid.uuid4())
    settled = await settle(
        counted_pool,
        db_now,
        Completion(m[0], Sent(m[0].lease, "p-0")),
        Completion(m[1], Sent(m[1].lease, "p-1")),
        Completion(m[5], Sent(stale, "p-late")),
        Completion(m[2], Retry(m[2].lease, 2.0, "timed out", "timeout")),
        Completion(m[3], Retry(m[3].lease, 2.0, "dropped", "ambiguous")),
        Completion(m[4], Dead(m[4].lease, DeadReason.REJECTED, "550", "smtp_550")),
    )
    assert sorted(settled) == sorted(ids)
    assert statements.take() == ["mark_sent", "schedule_retry", "mark_dead"]
    found = {i: events(rows) for i, rows in histories(db_conn).items()}
    assert found == {
        ids[0]: ["claimed", "sent"],
        ids[1]: ["claimed", "sent"],
        ids[2]: ["claimed", "retry"],
        ids[3]: ["claimed", "ambiguous"],
        ids[4]: ["claimed", "dead"],
        ids[5]: ["claimed", "lease_lost"],
    }
    lost = histories(db_conn)[ids[5]][1]
    assert (lost.worker_id, lost.provider_message_id) == (WORKER, "p-late")

    assert await settle(counted_pool, db_now, Completion(m[5], Release(m[5].lease))) == [ids[5]]
    assert statements.take() == ["release_leases"]
    assert events(histories(db_conn)[ids[5]]) == ["claimed", "lease_lost", "released"]


async def test_a_sweep_is_still_two_statements_with_their_history(
    counted_pool: AsyncConnectionPool,
    statements: Statements,
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    clock = ManualClock(db_now)
    held = db_insert(available_at=db_now - timedelta(seconds=10))  # oldest: claimed first
    expiring = db_insert(expires_at=db_now + timedelta(seconds=30))
    async with counted_pool.connection() as conn:
        await claiming.claim(
            conn, kinds=["otp"], limit=1, lease_seconds=10, worker_id=WORKER, now=db_now
        )
    statements.take()
    clock.advance(60)
    settings = WorkerSettings(kinds=("otp",), worker_id=WORKER)
    touched = await upkeep.sweep(counted_pool, settings, WorkerMetrics(), clock)
    assert touched == 2
    assert statements.take() == ["reclaim_expired_leases", "dead_letter_expired"]
    found = {i: events(rows) for i, rows in histories(db_conn).items()}
    assert found == {held: ["claimed", "lease_expired"], expiring: ["expired"]}
