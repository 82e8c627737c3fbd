"""Every edge of the state diagram leaves its row in the attempt history, and nothing else.

One message is driven through every transition the README and the design draw (claim, sent,
a transient retry, an ambiguous retry, a permanent failure, attempts exhausted at reclaim,
a lease expired and reclaimed, a lease released on shutdown, a lease lost on each of the
four settling statements, an OTP expiring while pending, a requeue), by the store's own
statements on a real PostgreSQL with the clock injected. After each step the whole history
table is read: exactly the expected rows were added, column by column, and no other.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from leasebox.states import DeadReason
from leasebox.store import claiming, settling, sweeps
from leasebox.store.claiming import ClaimedMessage, LeaseRef
from leasebox.store.dead_letters import DeadLetterFilter, requeue_dead_letters
from leasebox.store.settling import Dead, Retry, Sent
from support.history import Event, check_histories, histories
from support.worker_doubles import Insert, row_of

A, B = "worker-a", "worker-b"
LEASE = 45


def expected(event: str, at: datetime, **columns: Any) -> dict[str, Any]:
    """A history row as it must be: every column not named is NULL."""
    row: dict[str, Any] = dict.fromkeys(Event.__dataclass_fields__)
    row.update(event=event, at=at, **columns)
    del row["id"], row["outbox_id"]
    return row


def _text(column: str, value: Any) -> Any:
    """A lease token as text, as a claim hands it out; any other value as it is."""
    return str(value) if column == "lease_token" and value is not None else value


class Walk:
    """Reads the whole history after each step and compares what the step added."""

    def __init__(self, conn: psycopg.Connection[Any], outbox_id: int) -> None:
        self.conn = conn
        self.outbox_id = outbox_id
        self.seen: list[Event] = []

    def added(self, *rows: dict[str, Any]) -> list[Event]:
        everything = histories(self.conn)
        assert set(everything) <= {self.outbox_id}, "another message got history"
        now = everything.get(self.outbox_id, [])
        assert now[: len(self.seen)] == self.seen, "a history row changed or vanished"
        new = now[len(self.seen) :]
        found = [
            {k: _text(k, v) for k, v in asdict(e).items() if k not in ("id", "outbox_id")}
            for e in new
        ]
        assert found == list(rows)
        self.seen = now
        return new


async def claim(conn: psycopg.AsyncConnection[Any], worker: str, now: datetime) -> ClaimedMessage:
    [message] = await claiming.claim(
        conn, kinds=["otp"], limit=5, lease_seconds=LEASE, worker_id=worker, now=now
    )
    return message


def claimed(message: ClaimedMessage, worker: str, now: datetime) -> dict[str, Any]:
    return expected(
        "claimed",
        now,
        attempt=message.attempts,
        lease_token=message.lease_token,
        worker_id=worker,
        lease_expires_at=now + timedelta(seconds=LEASE),
    )


def database_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    conn.rollback()
    assert row is not None
    value: datetime = row[0]
    return value


async def test_every_state_transition_writes_exactly_its_history_row(
    db_aconn: psycopg.AsyncConnection[Any],
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    expires = db_now + timedelta(hours=1)
    outbox_id = db_insert(max_attempts=4, expires_at=expires)
    walk = Walk(db_conn, outbox_id)
    t = db_now
    walk.added()  # a pending message has no history yet

    # pending --claim--> processing, then a transient error: pending after a backoff.
    first = await claim(db_aconn, A, t)
    walk.added(claimed(first, A, t))
    t += timedelta(seconds=1)
    retry = Retry(first.lease, 2.0, "the send timed out", "timeout")
    assert await settling.schedule_retry(db_aconn, [retry], now=t, worker_id=A) == {outbox_id}
    walk.added(
        expected(
            "retry",
            t,
            attempt=1,
            lease_token=first.lease_token,
            worker_id=A,
            retry_delay_seconds=2.0,
            error_class="timeout",
            error="the send timed out",
        )
    )

    # An ambiguous failure (the provider may have taken it) retries, recorded as such.
    t += timedelta(seconds=5)
    second = await claim(db_aconn, B, t)
    walk.added(claimed(second, B, t))
    t += timedelta(seconds=1)
    drop = Retry(second.lease, 4.0, "dropped after the message was sent", "ambiguous")
    assert await settling.schedule_retry(db_aconn, [drop], now=t, worker_id=B) == {outbox_id}
    walk.added(
        expected(
            "ambiguous",
            t,
            attempt=2,
            lease_token=second.lease_token,
            worker_id=B,
            retry_delay_seconds=4.0,
            error_class="ambiguous",
            error="dropped after the message was sent",
        )
    )

    # Released on shutdown: pending at once, the attempt given back (and recorded).
    t += timedelta(seconds=5)
    third = await claim(db_aconn, A, t)
    walk.added(claimed(third, A, t))
    assert third.attempts == 3
    assert await settling.release_leases(db_aconn, [third.lease], now=t, worker_id=A) == {outbox_id}
    walk.added(expected("released", t, attempt=3, lease_token=third.lease_token, worker_id=A))
    assert row_of(db_conn, outbox_id)["attempts"] == 2

    # The lease expires (its worker died): any worker's sweep takes the row back.
    held = await claim(db_aconn, A, t)
    walk.added(claimed(held, A, t))
    ran_out = t + timedelta(seconds=LEASE)
    t = ran_out + timedelta(seconds=1)
    [back] = await sweeps.reclaim_expired_leases(db_aconn, default_max_attempts=8, now=t)
    assert str(back.status) == "pending"
    walk.added(
        expected(
            "lease_expired",
            t,
            attempt=3,
            lease_token=held.lease_token,
            worker_id=A,
            lease_expires_at=ran_out,
        )
    )

    # Another worker claims it; the stalled one then settles with its old lease, on each of
    # the four statements: the row is untouched, and each records what the stalled one learnt.
    fourth = await claim(db_aconn, B, t)
    walk.added(claimed(fourth, B, t))
    stale = held.lease
    t += timedelta(seconds=1)
    assert (
        await settling.mark_sent(db_aconn, [Sent(stale, "late-copy-1")], now=t, worker_id=A) == {}
    )
    walk.added(
        expected(
            "lease_lost",
            t,
            attempt=3,
            lease_token=stale.token,
            worker_id=A,
            provider_message_id="late-copy-1",
        )
    )
    late_retry = Retry(stale, 8.0, "connection refused", "connection")
    assert await settling.schedule_retry(db_aconn, [late_retry], now=t, worker_id=A) == set()
    lost = {"attempt": 3, "lease_token": stale.token, "worker_id": A}
    walk.added(
        expected("lease_lost", t, **lost, error_class="connection", error="connection refused")
    )
    late_dead = Dead(stale, DeadReason.REJECTED, "550 no such user", "smtp_550")
    assert await settling.mark_dead(db_aconn, [late_dead], now=t, worker_id=A) == set()
    walk.added(expected("lease_lost", t, **lost, error_class="smtp_550", error="550 no such user"))
    assert await settling.release_leases(db_aconn, [stale], now=t, worker_id=A) == set()
    walk.added(expected("lease_lost", t, **lost))
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["lease_token"], row["leased_by"]) == (
        "processing",
        fourth.lease_token,
        B,
    )

    # Its last attempt's lease expires too: out of attempts, the reclaim dead-letters it.
    ran_out = t - timedelta(seconds=1) + timedelta(seconds=LEASE)
    t = ran_out + timedelta(seconds=1)
    [gone] = await sweeps.reclaim_expired_leases(db_aconn, default_max_attempts=8, now=t)
    assert str(gone.status) == "dead"
    walk.added(
        expected(
            "lease_expired",
            t,
            attempt=4,
            lease_token=fourth.lease_token,
            worker_id=B,
            lease_expires_at=ran_out,
            dead_reason="attempts_exhausted",
        )
    )

    # dead --requeue (a person)--> pending, then a permanent failure: dead again.
    before = database_now(db_conn)
    assert requeue_dead_letters(db_conn, DeadLetterFilter(ids=(outbox_id,))) == [outbox_id]
    [requeued] = walk.added(expected("requeued", walk_time(db_conn, outbox_id)))
    assert before <= requeued.at <= database_now(db_conn)
    t = max(t, database_now(db_conn)) + timedelta(seconds=1)
    fifth = await claim(db_aconn, A, t)
    walk.added(claimed(fifth, A, t))
    assert fifth.attempts == 1
    rejected = Dead(fifth.lease, DeadReason.REJECTED, "550 no such user", "smtp_550")
    assert await settling.mark_dead(db_aconn, [rejected], now=t, worker_id=A) == {outbox_id}
    walk.added(
        expected(
            "dead",
            t,
            attempt=1,
            lease_token=fifth.lease_token,
            worker_id=A,
            dead_reason="rejected",
            error_class="smtp_550",
            error="550 no such user",
        )
    )

    # Requeued again, it waits past its expiry: the sweep dead-letters it, never sent late.
    requeue_dead_letters(db_conn, DeadLetterFilter(ids=(outbox_id,)))
    walk.added(expected("requeued", walk_time(db_conn, outbox_id)))
    t = expires + timedelta(seconds=1)
    [expired] = await sweeps.dead_letter_expired(db_aconn, now=t)
    assert expired.id == outbox_id
    walk.added(expected("expired", t, attempt=0, dead_reason="expired"))

    # Requeued with its expiry cleared, claimed and sent: the end of the walk.
    requeue_dead_letters(db_conn, DeadLetterFilter(ids=(outbox_id,)), clear_expiry=True)
    walk.added(expected("requeued", walk_time(db_conn, outbox_id)))
    t += timedelta(seconds=1)
    last = await claim(db_aconn, B, t)
    walk.added(claimed(last, B, t))
    sent = await settling.mark_sent(db_aconn, [Sent(last.lease, "provider-42")], now=t)
    assert set(sent) == {outbox_id}
    walk.added(
        expected(
            "sent",
            t,
            attempt=1,
            lease_token=last.lease_token,
            worker_id=B,
            provider_message_id="provider-42",
        )
    )
    assert [e.event for e in walk.seen].count("lease_lost") == 4
    assert check_histories(db_conn) == 1  # the walk, read back, agrees with the row


def walk_time(conn: psycopg.Connection[Any], outbox_id: int) -> datetime:
    """When the row was last changed by a statement on the database's own clock."""
    at: datetime = row_of(conn, outbox_id)["updated_at"]
    return at


async def test_a_batch_records_one_row_per_message_and_a_lost_lease_only_for_the_stale_one(
    db_aconn: psycopg.AsyncConnection[Any],
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    ids = [db_insert() for _ in range(3)]
    messages = await claiming.claim(
        db_aconn, kinds=["otp"], limit=5, lease_seconds=LEASE, worker_id=A, now=db_now
    )
    stranger = LeaseRef(messages[2].id, uuid.uuid4())
    batch = [Sent(messages[0].lease, "p-0"), Sent(messages[1].lease, None), Sent(stranger, "p-x")]
    settled = await settling.mark_sent(db_aconn, batch, now=db_now, worker_id=A)
    assert set(settled) == set(ids[:2])
    found = histories(db_conn)
    assert [e.event for e in found[ids[0]]] == ["claimed", "sent"]
    assert found[ids[0]][1].provider_message_id == "p-0"
    assert [e.event for e in found[ids[1]]] == ["claimed", "sent"]
    assert found[ids[1]][1].provider_message_id is None
    assert [e.event for e in found[ids[2]]] == ["claimed", "lease_lost"]
    # A token that never claimed the row has no claim to take its attempt from.
    assert (found[ids[2]][1].lease_token, found[ids[2]][1].attempt) == (stranger.token, None)


async def test_a_lost_lease_on_a_row_deleted_meanwhile_leaves_no_orphan_history(
    db_aconn: psycopg.AsyncConnection[Any],
    db_conn: psycopg.Connection[Any],
    db_insert: Insert,
    db_now: datetime,
) -> None:
    outbox_id = db_insert()
    [message] = await claiming.claim(
        db_aconn, kinds=["otp"], limit=1, lease_seconds=LEASE, worker_id=A, now=db_now
    )
    for table, key in (("queue", "id"), ("outbox", "id"), ("history", "outbox_id")):
        db_conn.execute(
            sql.SQL("DELETE FROM leasebox.{} WHERE {} = %s").format(
                sql.Identifier(table), sql.Identifier(key)
            ),
            (outbox_id,),
        )
    db_conn.commit()
    assert await settling.mark_sent(db_aconn, [Sent(message.lease, "p")], worker_id=A) == {}
    assert histories(db_conn) == {}
