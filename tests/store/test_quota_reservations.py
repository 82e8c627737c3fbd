"""The quota's reservations in the database: due times a token apart, `burst` of credit at
most after an idle spell, a pause respected, every worker's reservations in one order.

The clock is injected (`now`), so each due time is exact."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox.store import quotas

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def aconn(db_dsn: str) -> Any:
    async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
        yield conn


async def reserve(conn: Any, at: float, count: int, *, rate: float = 10.0, burst: int = 1) -> Any:
    return await quotas.reserve_tokens(
        conn,
        account="acct",
        rate=rate,
        burst=burst,
        count=count,
        now=T0 + timedelta(seconds=at),
    )


def seconds(moment: datetime) -> float:
    return round((moment - T0).total_seconds(), 6)


async def test_reservations_follow_one_another_a_token_apart(aconn: Any) -> None:
    first = await reserve(aconn, 0.0, 3)
    second = await reserve(aconn, 0.0, 2)
    late = await reserve(aconn, 5.0, 1)

    assert [seconds(first.due(i)) for i in range(3)] == [0.0, 0.1, 0.2]
    assert [seconds(second.due(i)) for i in range(2)] == [0.3, 0.4]
    assert seconds(late.due(0)) == 5.0  # idle: due at once, but no credit beyond burst 1


async def test_after_an_idle_spell_at_most_a_burst_is_due_at_once(aconn: Any) -> None:
    await reserve(aconn, 0.0, 1, burst=5)
    batch = await reserve(aconn, 60.0, 7, burst=5)

    due = [seconds(batch.due(i)) for i in range(7)]
    assert [d for d in due if d <= 60.0] == [59.6, 59.7, 59.8, 59.9, 60.0]
    assert due[5:] == [60.1, 60.2]


async def test_a_pause_moves_every_later_token_past_its_end(aconn: Any) -> None:
    await reserve(aconn, 0.0, 1)
    until = await quotas.pause_quota(aconn, account="acct", seconds=2.0, now=T0)
    after = await reserve(aconn, 0.5, 2)

    assert until is not None
    assert seconds(until) == 2.0
    assert [seconds(after.due(i)) for i in range(2)] == [2.0, 2.1]
    assert after.paused_until == until


async def test_no_stretch_holds_more_tokens_than_the_rate_and_burst_allow(aconn: Any) -> None:
    # Reservations of random sizes at random moments, as many workers would make them.
    draw = random.Random(7)
    due: list[float] = []
    at = 0.0
    for _ in range(200):
        at += draw.expovariate(20.0)
        reservation = await reserve(aconn, at, draw.randint(1, 6), rate=25.0, burst=4)
        due += [seconds(reservation.due(i)) for i in range(reservation.count)]
    due.sort()
    worst = max(
        (j - i + 1) - (25.0 * (due[j] - due[i]) + 4)
        for i in range(len(due))
        for j in range(i, min(len(due), i + 60))
    )
    assert worst <= 1e-6


def test_a_pause_notice_is_read_back_for_its_schema_only() -> None:
    assert quotas.pause_notice("leasebox:quota:1700000000.5:ses://eu-west-1", "leasebox") == (
        "ses://eu-west-1",
        1700000000.5,
    )
    assert quotas.pause_notice("other:quota:1700000000.5:acct", "leasebox") is None
    assert quotas.pause_notice("leasebox", "leasebox") is None
    assert quotas.pause_notice("leasebox:quota:soon:acct", "leasebox") is None
