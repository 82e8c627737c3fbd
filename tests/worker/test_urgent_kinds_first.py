"""Urgent kinds first, and nothing starves: the claim's priorities and aging.

A pool that serves `otp` and `verification` must not let ten thousand verification reminders
delay a login code: the claim takes the kinds of a higher priority first. A message of a
lower priority that has waited longer than its kind's SLA (its aging, counted from its
creation) goes ahead anyway, within the share of each claim the worker gives such messages,
so a steady stream of urgent messages never starves the others. Time is injected.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox.config import KindPriority
from leasebox.store import claiming
from support.running_worker import SETTINGS, make_worker, running
from support.waiting import wait_for_async
from support.worker_doubles import Insert, ManualClock, ScriptedProvider, row_of

PRIORITY = {"otp": 10, "verification": 0}
AGING = {"otp": 30.0, "verification": 600.0}


def verification(db_insert: Insert, created: datetime, available: datetime) -> int:
    return db_insert(
        kind="verification",
        recipient="verify@example.com",
        template="verification",
        data='{"link": "https://example.com/v/1"}',
        created_at=created,
        available_at=available,
    )


async def claim(
    conn: psycopg.AsyncConnection, now: datetime, limit: int, aged_limit: int = 0
) -> list[claiming.ClaimedMessage]:
    return await claiming.claim(
        conn,
        kinds=("otp", "verification"),
        limit=limit,
        lease_seconds=45,
        worker_id="w",
        now=now,
        priorities=PRIORITY,
        aging=AGING,
        aged_limit=aged_limit,
    )


async def test_the_claim_takes_the_higher_priority_first_however_old_the_rest(
    db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    old = [
        verification(db_insert, db_now - timedelta(seconds=60), db_now - timedelta(seconds=60))
        for _ in range(3)
    ]
    urgent = [db_insert(available_at=db_now - timedelta(seconds=1)) for _ in range(2)]

    first = await claim(db_aconn, db_now, limit=3)
    second = await claim(db_aconn, db_now, limit=3)

    assert sorted(m.id for m in first) == sorted([*urgent, old[0]])
    assert [m.id for m in second] == old[1:]


async def test_a_message_past_its_kinds_aging_goes_ahead_within_the_aged_share(
    db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    waited = verification(db_insert, db_now - timedelta(seconds=601), db_now)
    fresh = verification(db_insert, db_now - timedelta(seconds=5), db_now - timedelta(seconds=9))
    urgent = [db_insert(available_at=db_now - timedelta(seconds=1)) for _ in range(4)]

    without_share = await claim(db_aconn, db_now, limit=2)
    with_share = await claim(db_aconn, db_now, limit=2, aged_limit=1)

    assert {m.id for m in without_share} <= set(urgent), "no share: the priority decides"
    assert waited in {m.id for m in with_share}
    assert fresh not in {m.id for m in with_share}, "only a message past its aging goes ahead"
    assert len(with_share) == 2


async def test_without_priorities_the_claim_is_first_in_first_out_as_before(
    db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    older = verification(db_insert, db_now, db_now - timedelta(seconds=20))
    newer = db_insert(available_at=db_now - timedelta(seconds=10))

    taken = [
        await claiming.claim(
            db_aconn,
            kinds=("otp", "verification"),
            limit=1,
            lease_seconds=45,
            worker_id="w",
            now=db_now,
        )
        for _ in range(2)
    ]

    assert [[m.id for m in claim] for claim in taken] == [[older], [newer]]


async def test_a_flood_of_urgent_messages_never_starves_a_lower_kind_past_its_sla(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    fake_clock: ManualClock,
    db_now: datetime,
) -> None:
    # One sender and claims of four, and always more OTPs ready than a claim takes. The
    # verification's SLA is three seconds here, so that the injected clock passes it without
    # passing the leases of the rows the worker holds.
    settings = replace(
        SETTINGS,
        kinds=("otp", "verification"),
        concurrency=1,
        batch_size=4,
        priorities=(KindPriority("otp", 10, 30.0), KindPriority("verification", 0, 3.0)),
    )
    provider = ScriptedProvider()
    pause = provider.hold("flood-20@example.com")
    waiting = verification(db_insert, db_now - timedelta(seconds=1), db_now - timedelta(seconds=1))
    flood = [
        db_insert(recipient=f"flood-{i}@example.com", available_at=db_now - timedelta(seconds=1))
        for i in range(60)
    ]
    worker = make_worker(db_pool, provider, fake_clock, settings)
    async with running(worker):
        # Twenty OTPs out, forty waiting: within its SLA the verification waits behind them.
        await wait_for_async(
            lambda: provider.held["flood-20@example.com"].is_set(),
            what='provider.held["flood-20@example.com"].is_set()',
        )
        assert row_of(db_conn, waiting)["status"] == "pending"
        fake_clock.advance(4)  # now it has waited longer than its SLA
        pause.set()
        await wait_for_async(
            lambda: row_of(db_conn, waiting)["status"] == "sent",
            what='row_of(db_conn, waiting)["status"] == "sent"',
        )
        unsent = sum(row_of(db_conn, i)["status"] != "sent" for i in flood)
    order = [email.recipient for email in provider.sent]
    position = order.index("verify@example.com")
    # It went out among the next claims (the rows already held, then its claim's share)...
    assert position <= 21 + 2 * settings.capacity, order
    # ...while OTPs were still waiting: it did not wait for the flood to run dry.
    assert unsent >= 20, (unsent, order)
