"""A small batch waits for the outcomes of the sends in flight, and for nothing else.

The completion batcher writes each kind of outcome with one statement. When sends finish
one by one (SMTP, a mail API), it gathers the outcomes of the sends still in flight into
the same statement, for at most its linger; it writes at once when nothing is in flight,
when the last send in flight reports, when the batch is full, and when the worker closes.
Each test gives the batcher a linger far longer than its own deadline, so a batcher that
waits when it should not fails the test's assertion at the deadline, however slow the
machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.runtime.completion import LINGER_BELOW, Completion, CompletionBatcher
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.store import claiming
from leasebox.store.claiming import ClaimedMessage
from leasebox.store.settling import Sent
from support.counted_statements import Statements
from support.worker_doubles import Insert

Claim = Callable[[int], Awaitable[list[ClaimedMessage]]]
LONG_LINGER = 600.0
DEADLINE = 5.0


class Batcher:
    """A running batcher, the rows it settled, and a settable count of sends in flight."""

    def __init__(self, pool: AsyncConnectionPool, now: datetime, linger: float) -> None:
        self.in_flight = 0
        self.settled: list[int] = []
        self._progress = asyncio.Event()
        self.batcher = CompletionBatcher(
            pool,
            WorkerMetrics(),
            schema="leasebox",
            clock=lambda: now,
            on_settled=self._on_settled,
            lease_deadline=lambda _: time.monotonic() + 60,
            in_flight=lambda: self.in_flight,
            linger=linger,
        )
        self.task = asyncio.get_running_loop().create_task(self.batcher.run())

    def _on_settled(self, outbox_id: int) -> None:
        self.settled.append(outbox_id)
        self._progress.set()

    def sent(self, message: ClaimedMessage, *, in_flight_after: int) -> None:
        """A send of `message` finished, leaving `in_flight_after` sends still under way."""
        self.in_flight = in_flight_after
        self.batcher.put(Completion(message, Sent(message.lease, f"p-{message.id}")))

    async def settled_within_deadline(self, count: int) -> list[int]:
        """The ids settled once `count` are, or when the deadline has passed."""
        deadline = asyncio.get_running_loop().time() + DEADLINE
        while len(self.settled) < count:
            self._progress.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._progress.wait()
            except TimeoutError:
                break
        return sorted(self.settled)

    async def closed_within_deadline(self) -> bool:
        """Close the batcher; whether it had returned by the deadline."""
        closing = asyncio.get_running_loop().create_task(self.batcher.close())
        await asyncio.wait({closing}, timeout=DEADLINE)
        if closing.done():
            await self.task
        return closing.done()


@pytest.fixture
async def start(
    counted_pool: AsyncConnectionPool, db_now: datetime
) -> AsyncIterator[Callable[[float], Batcher]]:
    started: list[Batcher] = []

    def make(linger: float = LONG_LINGER) -> Batcher:
        started.append(Batcher(counted_pool, db_now, linger))
        return started[-1]

    yield make
    for batcher in started:
        batcher.task.cancel()


@pytest.fixture
def claim_rows(
    counted_pool: AsyncConnectionPool, statements: Statements, db_insert: Insert, db_now: datetime
) -> Claim:
    """Insert and claim `count` rows, in id order; the claim is not counted as settling."""

    async def claim(count: int) -> list[ClaimedMessage]:
        ids = [db_insert() for _ in range(count)]
        async with counted_pool.connection() as conn:
            rows = await claiming.claim(
                conn, kinds=["otp"], limit=count, lease_seconds=60, worker_id="w", now=db_now
            )
        assert sorted(m.id for m in rows) == sorted(ids)
        statements.take()
        return sorted(rows, key=lambda m: m.id)

    return claim


def sent_rows(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM leasebox.messages WHERE status = 'sent'").fetchone()
    conn.rollback()
    assert row is not None
    return int(row[0])


async def test_outcomes_of_the_sends_in_flight_are_gathered_into_one_statement(
    start: Callable[..., Batcher],
    claim_rows: Claim,
    statements: Statements,
    db_conn: psycopg.Connection[Any],
) -> None:
    first, second, third = await claim_rows(3)
    batcher = start()

    batcher.sent(first, in_flight_after=2)
    batcher.sent(second, in_flight_after=1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert statements.take() == []  # still waiting for the third send
    batcher.sent(third, in_flight_after=0)
    assert await batcher.settled_within_deadline(3) == [first.id, second.id, third.id]

    assert statements.take() == ["mark_sent"]
    assert sent_rows(db_conn) == 3
    assert await batcher.closed_within_deadline()


async def test_with_nothing_in_flight_an_outcome_is_written_at_once(
    start: Callable[..., Batcher],
    claim_rows: Claim,
    statements: Statements,
) -> None:
    [message] = await claim_rows(1)
    batcher = start()

    batcher.sent(message, in_flight_after=0)

    assert await batcher.settled_within_deadline(1) == [message.id]
    assert statements.take() == ["mark_sent"]
    assert await batcher.closed_within_deadline()


async def test_a_full_batch_is_written_without_waiting_for_the_sends_in_flight(
    start: Callable[..., Batcher],
    claim_rows: Claim,
    statements: Statements,
) -> None:
    messages = await claim_rows(LINGER_BELOW)
    batcher = start()

    for message in messages:
        batcher.sent(message, in_flight_after=5)

    assert await batcher.settled_within_deadline(LINGER_BELOW) == [m.id for m in messages]
    assert statements.take() == ["mark_sent"]
    assert await batcher.closed_within_deadline()


async def test_closing_writes_a_gathering_batch_at_once(
    start: Callable[..., Batcher],
    claim_rows: Claim,
    db_conn: psycopg.Connection[Any],
) -> None:
    [message] = await claim_rows(1)
    batcher = start()

    batcher.sent(message, in_flight_after=3)
    for _ in range(20):
        await asyncio.sleep(0)
    assert batcher.settled == []

    assert await batcher.closed_within_deadline()
    assert batcher.settled == [message.id]
    assert sent_rows(db_conn) == 1


async def test_a_batch_waits_no_longer_than_its_linger(
    start: Callable[..., Batcher],
    claim_rows: Claim,
) -> None:
    [message] = await claim_rows(1)
    linger = 0.2
    batcher = start(linger)

    began = time.monotonic()
    batcher.sent(message, in_flight_after=4)  # and they never report

    assert await batcher.settled_within_deadline(1) == [message.id]
    assert time.monotonic() - began >= linger
    assert await batcher.closed_within_deadline()
