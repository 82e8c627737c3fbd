"""The claim and settling statements against a real PostgreSQL, with time injected."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox.states import DeadReason, Status
from leasebox.store import claiming, settling, sweeps
from leasebox.store.claiming import Cursor, LeaseRef
from leasebox.store.settling import Dead, Retry, Sent
from support.worker_doubles import Insert, row_of, statuses

WORKER = "worker-a"


async def _claim(
    conn: psycopg.AsyncConnection, now: datetime, limit: int = 10, kinds: tuple[str, ...] = ("otp",)
) -> list[claiming.ClaimedMessage]:
    return await claiming.claim(
        conn, kinds=kinds, limit=limit, lease_seconds=45, worker_id=WORKER, now=now
    )


async def _reclaim(db_aconn: psycopg.AsyncConnection[Any], now: datetime) -> list[sweeps.Reclaimed]:
    return await sweeps.reclaim_expired_leases(db_aconn, default_max_attempts=8, now=now)


async def test_claim_sets_a_fresh_lease_and_counts_the_attempt(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert(attempts=2)
    [claimed] = await _claim(db_aconn, db_now)
    row = row_of(db_conn, outbox_id)
    assert claimed.id == outbox_id
    assert claimed.attempts == 3 == row["attempts"]
    assert row["status"] == "processing"
    assert row["lease_token"] == claimed.lease_token
    assert row["lease_expires_at"] == db_now + timedelta(seconds=45)
    assert row["leased_by"] == WORKER
    assert claimed.claimed_at == db_now
    assert claimed.secrets is not None
    assert claimed.data == {"minutes_valid": 10}
    assert await _claim(db_aconn, db_now + timedelta(seconds=1)) == []


async def test_claim_takes_only_ready_rows_of_its_kinds_oldest_availability_first(
    db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    later = db_insert(available_at=db_now - timedelta(seconds=10))
    earliest = db_insert(
        available_at=db_now - timedelta(seconds=30), kind="invite", template="invite"
    )
    middle = db_insert(available_at=db_now - timedelta(seconds=20))
    db_insert(available_at=db_now + timedelta(seconds=60))  # in backoff: not ready
    db_insert(kind="newsletter", available_at=db_now - timedelta(seconds=99))  # another kind
    claimed = await _claim(db_aconn, db_now, kinds=("otp", "invite"))
    assert [m.id for m in claimed] == [earliest, middle, later]


async def test_a_claim_with_a_cursor_reads_on_from_it_and_one_without_from_the_start(
    db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    ids = [db_insert(available_at=db_now - timedelta(seconds=10 - i)) for i in range(4)]
    early = db_insert(kind="invite", template="invite", available_at=db_now - timedelta(hours=1))
    [*_, second] = await _claim(db_aconn, db_now, limit=2)
    # Committed after the claim passed its place (its transaction began before them).
    late = db_insert(available_at=db_now - timedelta(minutes=1))
    cursor = {"otp": Cursor(second.available_at, second.id)}
    on = await claiming.claim(
        db_aconn, kinds=["otp", "invite"], limit=10, lease_seconds=45, worker_id=WORKER,
        now=db_now, after=cursor,
    )  # fmt: skip
    assert second.id == ids[1]
    assert [m.id for m in on] == [early, ids[2], ids[3]]  # a kind without a cursor: all of it
    assert [m.id for m in await _claim(db_aconn, db_now)] == [late]


async def test_claim_respects_its_limit_across_kinds(
    db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    for i in range(3):
        db_insert(available_at=db_now - timedelta(seconds=10 + i))
        db_insert(kind="invite", template="invite", available_at=db_now - timedelta(seconds=i))
    claimed = await _claim(db_aconn, db_now, limit=4, kinds=("otp", "invite"))
    assert len(claimed) == 4
    assert [m.kind for m in claimed] == ["otp", "otp", "otp", "invite"]


async def test_two_claimers_skip_each_others_locked_rows(
    db_dsn: str, db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    ids = {db_insert() for _ in range(6)}
    async with await psycopg.AsyncConnection.connect(db_dsn) as holding:
        # The first claim's transaction stays open, so its rows stay locked. A claimer that
        # waited for those locks would hit the lock timeout instead of skipping them.
        first = await _claim(holding, db_now, limit=3)
        await db_aconn.execute("SET lock_timeout = '5s'")
        try:
            second = await _claim(db_aconn, db_now, limit=10)
        except psycopg.errors.LockNotAvailable:
            pytest.fail("the second claimer waited for the first one's locks")
        await holding.commit()
    assert len(first) == 3
    assert {m.id for m in first} | {m.id for m in second} == ids
    assert not {m.id for m in first} & {m.id for m in second}


async def test_completion_with_a_stale_token_updates_nothing(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert()
    [claimed] = await _claim(db_aconn, db_now)
    stale = LeaseRef(outbox_id, uuid.uuid4())
    assert await settling.mark_sent(db_aconn, [Sent(stale, "x")], now=db_now) == {}
    assert await settling.schedule_retry(db_aconn, [Retry(stale, 5, "e", "timeout")]) == set()
    assert (
        await settling.mark_dead(db_aconn, [Dead(stale, DeadReason.REJECTED, "e", "smtp_550")])
        == set()
    )
    assert await claiming.extend_leases(db_aconn, [stale], lease_seconds=45) == {}
    assert await settling.release_leases(db_aconn, [stale]) == set()
    row = row_of(db_conn, outbox_id)
    assert row["status"] == "processing"
    assert row["lease_token"] == claimed.lease_token


async def test_mark_sent_records_the_outcome_and_the_latency_from_creation(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    first, second = db_insert(), db_insert()
    claimed = await _claim(db_aconn, db_now)
    sent_at = db_now + timedelta(seconds=3)
    leases = [LeaseRef(m.id, m.lease_token) for m in claimed]
    latencies = await settling.mark_sent(
        db_aconn, [Sent(leases[0], "provider-1"), Sent(leases[1], None)], now=sent_at
    )
    created = row_of(db_conn, first)["created_at"]
    assert latencies == {first: (sent_at - created).total_seconds(), second: latencies[second]}
    row = row_of(db_conn, first)
    assert (row["status"], row["provider_message_id"], row["sent_at"]) == (
        "sent",
        "provider-1",
        sent_at,
    )
    assert row["lease_token"] is None
    assert row_of(db_conn, second)["provider_message_id"] is None
    # Settled rows can be settled no further.
    assert await settling.mark_sent(db_aconn, [Sent(leases[0], "again")]) == {}


async def test_retry_returns_the_row_to_pending_after_its_delay(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert()
    [claimed] = await _claim(db_aconn, db_now)
    lease = LeaseRef(claimed.id, claimed.lease_token)
    assert await settling.schedule_retry(
        db_aconn, [Retry(lease, 8.5, "451 try later", "smtp_451")], now=db_now
    ) == {outbox_id}
    row = row_of(db_conn, outbox_id)
    assert row["status"] == "pending"
    assert row["available_at"] == db_now + timedelta(seconds=8.5)
    assert (row["last_error"], row["last_error_class"], row["attempts"]) == (
        "451 try later",
        "smtp_451",
        1,
    )
    assert await _claim(db_aconn, db_now + timedelta(seconds=8)) == []
    assert len(await _claim(db_aconn, db_now + timedelta(seconds=9))) == 1


async def test_mark_dead_records_the_reason(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert()
    [claimed] = await _claim(db_aconn, db_now)
    lease = LeaseRef(claimed.id, claimed.lease_token)
    await settling.mark_dead(
        db_aconn, [Dead(lease, DeadReason.REJECTED, "550 no such user", "smtp_550")]
    )
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"], row["last_error_class"]) == (
        "dead",
        "rejected",
        "smtp_550",
    )


async def test_extending_a_lease_pushes_its_expiry_from_now(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert()
    [claimed] = await _claim(db_aconn, db_now)
    later = db_now + timedelta(seconds=30)
    kept = await claiming.extend_leases(
        db_aconn, [LeaseRef(outbox_id, claimed.lease_token)], lease_seconds=45, now=later
    )
    assert kept == {outbox_id: later + timedelta(seconds=45)}
    assert row_of(db_conn, outbox_id)["lease_expires_at"] == later + timedelta(seconds=45)
    # Extended, the lease is not reclaimed when the first expiry passes.
    assert (
        await sweeps.reclaim_expired_leases(
            db_aconn, default_max_attempts=8, now=db_now + timedelta(seconds=50)
        )
        == []
    )


async def test_releasing_a_lease_makes_the_row_ready_at_once_with_the_attempt_undone(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert()
    [claimed] = await _claim(db_aconn, db_now)
    released = await settling.release_leases(
        db_aconn, [LeaseRef(outbox_id, claimed.lease_token)], now=db_now
    )
    assert released == {outbox_id}
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["attempts"], row["lease_token"]) == ("pending", 0, None)
    assert [m.id for m in await _claim(db_aconn, db_now)] == [outbox_id]


async def test_expired_leases_are_reclaimed_by_anyone_once_the_lease_is_over(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert()
    [claimed] = await _claim(db_aconn, db_now)
    assert (
        await sweeps.reclaim_expired_leases(
            db_aconn, default_max_attempts=8, now=db_now + timedelta(seconds=44)
        )
        == []
    )
    reclaimed = await sweeps.reclaim_expired_leases(
        db_aconn, default_max_attempts=8, now=db_now + timedelta(seconds=46)
    )
    assert reclaimed == [sweeps.Reclaimed(outbox_id, "otp", Status.PENDING)]
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["attempts"], row["last_error_class"]) == (
        "pending",
        1,
        "lease_expired",
    )
    # The old owner can no longer settle it; a new claim gets a new token.
    old = LeaseRef(outbox_id, claimed.lease_token)
    assert await settling.mark_sent(db_aconn, [Sent(old, None)]) == {}
    [again] = await _claim(db_aconn, db_now + timedelta(seconds=47))
    assert again.lease_token != claimed.lease_token
    assert again.attempts == 2


async def test_a_reclaimed_row_out_of_attempts_becomes_a_dead_letter(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert(max_attempts=2, attempts=1)
    await _claim(db_aconn, db_now)
    reclaimed = await sweeps.reclaim_expired_leases(
        db_aconn, default_max_attempts=8, now=db_now + timedelta(minutes=5)
    )
    assert reclaimed == [sweeps.Reclaimed(outbox_id, "otp", Status.DEAD)]
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "attempts_exhausted", 2)


async def test_an_otp_past_its_expiry_is_never_claimed(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    expiring = db_insert(expires_at=db_now + timedelta(seconds=60))
    lasting = db_insert(expires_at=None)
    later = db_insert(expires_at=db_now + timedelta(seconds=600))
    # No sweep has run: the claim itself passes over the expired row.
    claimed = await _claim(db_aconn, db_now + timedelta(seconds=60))
    assert [m.id for m in claimed] == [lasting, later]
    row = row_of(db_conn, expiring)
    assert (row["status"], row["attempts"], row["lease_token"]) == ("pending", 0, None)


async def test_the_sweep_dead_letters_only_otps_past_their_expiry(
    db_aconn: psycopg.AsyncConnection,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
) -> None:
    expiring = db_insert(expires_at=db_now + timedelta(seconds=60))
    lasting = db_insert(expires_at=None)
    later = db_insert(expires_at=db_now + timedelta(seconds=600))
    expired = await sweeps.dead_letter_expired(db_aconn, now=db_now + timedelta(seconds=61))
    assert expired == [sweeps.Expired(expiring, "otp")]
    row = row_of(db_conn, expiring)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "expired", 0)
    assert statuses(db_conn) == {"dead": 1, "pending": 2}
    assert {row_of(db_conn, i)["status"] for i in (lasting, later)} == {"pending"}


async def test_the_claim_and_mark_sent_are_prepared_at_their_first_run_on_a_connection(
    db_aconn: psycopg.AsyncConnection, db_insert: Insert, db_now: datetime
) -> None:
    async def prepared() -> set[str]:
        cur = await db_aconn.execute("SELECT statement FROM pg_prepared_statements")
        return {str(text).split("*/")[0] + "*/" for (text,) in await cur.fetchall()}

    db_insert()
    [claimed] = await _claim(db_aconn, db_now)
    assert await prepared() == {"/* leasebox claim */"}
    assert await settling.mark_sent(db_aconn, [Sent(claimed.lease, None)], now=db_now)
    assert await prepared() == {"/* leasebox claim */", "/* leasebox mark_sent */"}
