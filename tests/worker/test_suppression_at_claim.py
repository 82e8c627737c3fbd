"""A worker reads the suppression list when it claims: a message to a listed mailbox ends
`suppressed`, unsent, no attempt spent, counted on its own metric; a provider's refusal of an
address it suppresses ends the message the same way and lists the mailbox."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox.store import claiming
from leasebox.store.suppressions import Entry, add_suppressions, list_suppressions
from support.running_worker import SETTINGS, make_worker
from support.worker_doubles import Insert, ManualClock, ScriptedProvider, row_of, statuses


def _history(conn: psycopg.Connection[Any], outbox_id: int) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT event, attempt, error_class, error FROM leasebox.history"
        " WHERE outbox_id = %s ORDER BY id",
        (outbox_id,),
    ).fetchall()
    conn.rollback()
    return rows


def _to(address: str, scope: str = "default") -> dict[str, Any]:
    return {"recipient": address, "recipient_key": address.lower(), "scope": scope}


async def test_a_claim_settles_a_suppressed_mailbox_instead_of_leasing_it(
    db_aconn: psycopg.AsyncConnection[Any],
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    add_suppressions(
        db_conn,
        [
            Entry("gone@example.com", reason="hard_bounce", detail="5.1.1"),
            Entry("old@example.com", reason="soft_bounces", expires_at=db_now - timedelta(1)),
        ],
    )
    first = db_insert(**_to("ok@example.com"), attempts=1)
    barred = db_insert(**_to("gone@example.com"), attempts=1)
    elsewhere = db_insert(**_to("gone@example.com", scope="signup"))
    expired = db_insert(**_to("old@example.com"))

    claimed = await claiming.claim(
        db_aconn, kinds=["otp"], limit=10, lease_seconds=45, worker_id="w", now=db_now
    )

    assert sorted(m.id for m in claimed) == sorted([first, elsewhere, expired])
    assert [(m.id, m.suppression) for m in claimed.suppressed] == [(barred, "hard_bounce")]
    assert claimed.chosen == 4
    row = row_of(db_conn, barred)
    assert (row["status"], row["attempts"], row["sent_at"]) == ("suppressed", 1, None)
    assert _history(db_conn, barred) == [("suppressed", 1, "suppression_list", "hard_bounce")]
    assert statuses(db_conn) == {"processing": 3, "suppressed": 1}
    again = await claiming.claim(
        db_aconn, kinds=["otp"], limit=10, lease_seconds=45, worker_id="w", now=db_now
    )
    assert (list(again), again.suppressed) == ([], [])


async def test_a_worker_never_sends_to_a_suppressed_mailbox_and_counts_it(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection[Any],
) -> None:
    add_suppressions(db_conn, [Entry("gone@example.com", reason="complaint")])
    # A full batch of suppressed rows ahead of a sendable one: the claim loop goes on to it.
    barred = [db_insert(**_to("gone@example.com")) for _ in range(SETTINGS.batch_size)]
    sendable = db_insert(**_to("ok@example.com"))
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True))

    async with asyncio.timeout(20):
        await worker.run()

    assert [e.outbox_id for e in fake_provider.sent] == [sendable]
    assert all(row_of(db_conn, i)["status"] == "suppressed" for i in barred)
    labels = {"kind": "otp", "source": "suppression_list"}
    assert worker.metrics.value("leasebox_suppressed_total", labels) == len(barred)
    assert worker.metrics.value("leasebox_claimed_total", {"kind": "otp"}) == 1
    assert (
        worker.metrics.value("leasebox_dead_letters_total", {"kind": "otp", "reason": "rejected"})
        == 0
    )


async def test_a_providers_refusal_of_a_suppressed_address_lists_the_mailbox(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection[Any],
) -> None:
    fake_provider.refusals["inactive@example.com"] = "postmark_406"
    first = db_insert(**_to("inactive@example.com"))
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True))
    async with asyncio.timeout(20):
        await worker.run()
    second = db_insert(**_to("inactive@example.com"))
    worker = make_worker(db_pool, fake_provider, fake_clock, replace(SETTINGS, drain=True))
    async with asyncio.timeout(20):
        await worker.run()

    assert fake_provider.attempts["inactive@example.com"] == 1
    assert row_of(db_conn, first)["status"] == "suppressed"
    assert row_of(db_conn, first)["dead_reason"] is None
    assert _history(db_conn, first)[-1][:3] == ("suppressed", 1, "postmark_406")
    assert _history(db_conn, second) == [("suppressed", 0, "suppression_list", "provider")]
    [entry] = list_suppressions(db_conn)
    assert (entry.recipient_key, entry.reason, entry.detail) == (
        "inactive@example.com",
        "provider",
        "postmark_406",
    )
    assert entry.expires_at is not None
    assert entry.expires_at - fake_clock.now == timedelta(days=30)


async def test_a_provider_refusal_lists_the_mailbox_for_the_days_the_worker_is_given(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection[Any],
) -> None:
    fake_provider.refusals["inactive@example.com"] = "postmark_406"
    db_insert(**_to("inactive@example.com"))
    settings = replace(SETTINGS, drain=True, feedback_provider_days=7.0)
    worker = make_worker(db_pool, fake_provider, fake_clock, settings)
    async with asyncio.timeout(20):
        await worker.run()

    [entry] = list_suppressions(db_conn)
    assert entry.expires_at is not None
    assert entry.expires_at - fake_clock.now == timedelta(days=7)
