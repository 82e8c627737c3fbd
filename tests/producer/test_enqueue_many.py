"""`enqueue_many` writes a batch in one statement with the semantics of `enqueue` per message:
reused receipts, delivery keys, duplicates inside the batch; a conflict writes nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from leasebox import (
    AbuseGuard,
    BatchConflict,
    ConfigurationError,
    IdempotencyConflict,
    enqueue,
    enqueue_many,
    enqueue_many_async,
)
from leasebox.db.queries import query
from leasebox.errors import DatabaseError
from leasebox.messages import DEFAULT_RECEIPT_TTL_SECONDS
from leasebox.producer.batch import _prepare
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE, default_cipher
from support.outbox_rows import count, otp
from support.plans import full_scans, generic_plan_of, indexes, plan_of, reads, rescans
from support.waiting import second_while_first_is_open


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")


def test_a_mixed_batch_gets_one_receipt_per_message_in_input_order(
    db_conn: psycopg.Connection[Any],
) -> None:
    earlier = enqueue(db_conn, otp("old@example.com"), idempotency_key="old", scope="s")
    shared = enqueue(db_conn, otp("key@example.com", delivery_key="otp:user-1:c1"))
    db_conn.commit()
    receipts = enqueue_many(
        db_conn,
        [
            otp("new@example.com"),  # new
            otp("old@example.com"),  # reuses a live receipt
            otp("twice@example.com"),  # new ...
            otp("twice@example.com"),  # ... and the same request again in the batch
            otp("key@example.com", delivery_key="otp:user-1:c1"),  # an existing delivery key
            otp("nokey@example.com"),  # no idempotency key at all
        ],
        idempotency_keys=["new", "old", "twice", "twice", "dk", None],
        scope="s",
    )
    db_conn.commit()
    assert [r.reused for r in receipts] == [False, True, False, True, True, False]
    assert receipts[1].outbox_id == earlier.outbox_id
    assert receipts[3].outbox_id == receipts[2].outbox_id
    assert receipts[4].outbox_id == shared.outbox_id
    assert receipts[5].idempotency_key is None
    assert receipts[5].scope == "s"
    assert [r.idempotency_key for r in receipts[:5]] == ["new", "old", "twice", "twice", "dk"]
    assert count(db_conn, "outbox") == 5  # 2 before, 3 new (new, twice, nokey)
    assert count(db_conn, "receipts") == 4  # old, new, twice, dk
    again = enqueue(db_conn, otp("new@example.com"), idempotency_key="new", scope="s")
    assert again.reused
    assert again.outbox_id == receipts[0].outbox_id


def test_each_message_of_a_batch_is_stored_as_given_whatever_its_text_holds(
    db_conn: psycopg.Connection[Any],
) -> None:
    messages = [
        otp("o'brien@example.com", aggregate_id=None, data={"name": 'Ann "A" \\ B'}),
        otp("zoe@exämple.com", aggregate_id="NULL", data={"name": "Zoë", "deep": {"a": [1, 2]}}),
        otp("x{y}@example.com", aggregate_id='a,{b} "c"', data={}),
        otp("plain@example.com", replacement_key="login:ann", data={"x": None, "y": 1.5}),
    ]
    receipts = enqueue_many(
        db_conn, messages, idempotency_keys=['k "1"', None, "k\\3", "k,4"], scope="s"
    )
    db_conn.commit()
    stored = db_conn.execute(
        "SELECT o.id, o.recipient, o.aggregate_id, o.data, o.replacement_key, r.idempotency_key"
        " FROM leasebox.outbox AS o LEFT JOIN leasebox.receipts AS r ON r.outbox_id = o.id"
        " WHERE o.id = ANY(%s)",
        [[r.outbox_id for r in receipts]],
    ).fetchall()
    by_id = {row[0]: row[1:] for row in stored}
    assert [by_id[r.outbox_id] for r in receipts] == [
        ("o'brien@example.com", None, {"name": 'Ann "A" \\ B'}, None, 'k "1"'),
        ("zoe@exämple.com", "NULL", {"name": "Zoë", "deep": {"a": [1, 2]}}, None, None),
        ("x{y}@example.com", 'a,{b} "c"', {}, None, "k\\3"),
        ("plain@example.com", "user-1", {"x": None, "y": 1.5}, "login:ann", "k,4"),
    ]


def test_a_conflict_in_the_batch_writes_nothing_and_names_every_offender(
    db_conn: psycopg.Connection[Any],
) -> None:
    enqueue(db_conn, otp("old@example.com"), idempotency_key="old", scope="s")
    enqueue(db_conn, otp("key@example.com", delivery_key="otp:user-1:c1"))
    db_conn.commit()
    with pytest.raises(BatchConflict) as raised:
        enqueue_many(
            db_conn,
            [
                otp("fresh@example.com"),
                otp("other@example.com"),  # "old" was another request
                otp("else@example.com", delivery_key="otp:user-1:c1"),  # another message
            ],
            idempotency_keys=["fresh", "old", None],
            scope="s",
        )
    assert isinstance(raised.value, IdempotencyConflict)
    assert [(c.index, c.idempotency_key, c.delivery_key) for c in raised.value.conflicts] == [
        (1, "old", None),
        (2, None, "otp:user-1:c1"),
    ]
    assert "#1 (idempotency key 'old')" in str(raised.value)
    db_conn.commit()
    assert count(db_conn, "outbox") == 2
    assert count(db_conn, "receipts") == 1


def test_the_same_key_for_two_different_requests_in_one_batch_is_a_conflict(
    db_conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(BatchConflict) as raised:
        enqueue_many(
            db_conn, [otp("a@example.com"), otp("b@example.com")], idempotency_keys=["k", "k"]
        )
    assert [c.index for c in raised.value.conflicts] == [1]
    with pytest.raises(BatchConflict):
        enqueue_many(
            db_conn,
            [otp("a@example.com", delivery_key="k"), otp("b@example.com", delivery_key="k")],
        )
    db_conn.commit()
    assert count(db_conn, "outbox") == 0


def test_one_delivery_key_twice_in_a_batch_is_one_row(db_conn: psycopg.Connection[Any]) -> None:
    first, second = enqueue_many(
        db_conn, [otp(delivery_key="otp:user-1:c2"), otp(delivery_key="otp:user-1:c2")]
    )
    db_conn.commit()
    assert first.outbox_id == second.outbox_id
    assert (first.reused, second.reused) == (False, True)
    assert count(db_conn, "outbox") == 1


def test_a_delivery_key_repeated_after_a_reused_receipt_is_written_by_the_repeat(
    db_conn: psycopg.Connection[Any],
) -> None:
    # The first message reuses a receipt whose send went out under another delivery key, so
    # the key the batch gives twice is in no message yet: the second message writes it.
    earlier = enqueue(
        db_conn,
        otp(delivery_key="otp:user-1:c1"),
        idempotency_key="first",
        request_hash="the-request",
    )
    db_conn.commit()
    reused, written = enqueue_many(
        db_conn,
        [otp(delivery_key="otp:user-1:c2"), otp(delivery_key="otp:user-1:c2")],
        idempotency_keys=["first", "second"],
        request_hashes=["the-request", None],
    )
    db_conn.commit()
    assert (reused.outbox_id, reused.delivery_key, reused.reused) == (
        earlier.outbox_id,
        "otp:user-1:c1",
        True,
    )
    assert (written.delivery_key, written.reused) == ("otp:user-1:c2", False)
    assert written.outbox_id != earlier.outbox_id
    assert count(db_conn, "outbox") == 2
    assert count(db_conn, "queue") == 2


def test_a_delivery_key_written_by_hand_while_the_batch_runs_fails_it_with_a_clear_error(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    # Leasebox's own writers serialise on the key's lock; a row inserted by hand does not,
    # and the batch must neither write a second row under the key nor return a false receipt.
    by_hand = psycopg.connect(db_dsn)
    by_hand.execute(
        "INSERT INTO leasebox.outbox (bucket, kind, recipient, template, delivery_key)"
        " VALUES ((now() AT TIME ZONE 'UTC')::date, 'otp', 'x@example.com', 'otp', 'otp:hand')"
    )
    outcome = second_while_first_is_open(
        db_dsn,
        db_conn,
        by_hand,
        lambda c: enqueue_many(
            c,
            [otp("a@example.com"), otp(delivery_key="otp:hand"), otp("b@example.com")],
            idempotency_keys=["a", "hand", "b"],
        ),
    )
    assert isinstance(outcome, DatabaseError), repr(outcome)
    assert "without leasebox's lock" in str(outcome)
    assert "nothing of the batch was written" in str(outcome)
    assert count(db_conn, "outbox") == 1
    assert count(db_conn, "queue") == 0
    assert count(db_conn, "receipts") == 0


def test_a_rolled_back_batch_leaves_nothing(db_conn: psycopg.Connection[Any]) -> None:
    enqueue_many(db_conn, [otp(f"u{i}@example.com") for i in range(10)], idempotency_keys=None)
    db_conn.rollback()
    assert count(db_conn, "outbox") == 0
    assert count(db_conn, "receipts") == 0


def test_a_batch_of_a_thousand_is_written_once_and_its_retry_reuses_every_receipt(
    db_conn: psycopg.Connection[Any],
) -> None:
    messages = [otp(f"user{i}@example.com", aggregate_id=f"user-{i}") for i in range(1000)]
    keys = [f"request-{i}" for i in range(1000)]
    receipts = enqueue_many(db_conn, messages, idempotency_keys=keys, scope="bulk")
    db_conn.commit()
    assert not any(r.reused for r in receipts)
    ids = [r.outbox_id for r in receipts]
    assert ids == sorted(ids)
    assert len(set(ids)) == 1000
    retried = enqueue_many(db_conn, messages, idempotency_keys=keys, scope="bulk")
    db_conn.commit()
    assert all(r.reused for r in retried)
    assert [r.outbox_id for r in retried] == ids
    assert count(db_conn, "outbox") == 1000


async def test_the_async_batch_has_the_same_semantics(db_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        first = await enqueue_many_async(
            conn, [otp(), otp("b@example.com")], idempotency_keys=["a", "b"]
        )
        await conn.commit()
        again = await enqueue_many_async(conn, [otp()], idempotency_keys=["a"])
        await conn.commit()
        assert again[0].reused
        assert again[0].outbox_id == first[0].outbox_id
        with pytest.raises(BatchConflict):
            await enqueue_many_async(conn, [otp("c@example.com")], idempotency_keys=["a"])
        await conn.rollback()
        assert await enqueue_many_async(conn, []) == []


def test_a_batch_refuses_a_guard_and_malformed_keys_with_clear_errors(
    db_conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(ConfigurationError, match="abuse guard"):
        enqueue_many(db_conn, [otp()], guard=AbuseGuard(per_recipient=1))
    with pytest.raises(ValueError, match="one entry per message"):
        enqueue_many(db_conn, [otp()], idempotency_keys=["a", "b"])
    with pytest.raises(ValueError, match="non-empty string"):
        enqueue_many(db_conn, [otp()], idempotency_keys=[""])
    with pytest.raises(TypeError, match="OutboxMessage"):
        enqueue_many(db_conn, [{"kind": "otp"}])  # type: ignore[list-item]


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh rows", "analyzed"])
def test_a_retried_batch_finds_each_receipts_message_by_its_key_not_by_scanning_the_outbox(
    db_conn: psycopg.Connection[Any], analyzed: bool
) -> None:
    # A join from the receipts to the outbox on the id alone let the planner scan the whole
    # outbox once per message: a batch then cost more the more messages had been sent.
    messages = [otp(f"user{i}@example.com") for i in range(3000)]
    keys = [f"request-{i}" for i in range(3000)]
    enqueue_many(db_conn, messages, idempotency_keys=keys, scope="bulk")
    db_conn.commit()
    if analyzed:
        db_conn.execute("ANALYZE leasebox.outbox, leasebox.receipts")
        db_conn.commit()
    retry = _prepare(
        messages[:100],
        keys[:100],
        "bulk",
        None,
        None,
        DEFAULT_RECEIPT_TTL_SECONDS,
        "leasebox",
        default_cipher(),
    )
    found = plan_of(db_conn, query("enqueue_many"), retry.write[1])
    assert not [s for s in full_scans(db_conn, found) if "outbox" in s], reads(found)
    assert {"outbox_pkey", "receipts_pkey"} <= indexes(db_conn, found)


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_no_step_of_a_batch_reads_the_batch_again_for_each_of_its_messages(
    db_conn: psycopg.Connection[Any], generic: bool
) -> None:
    # Steps that found each message's row in another of the statement's sets by a join cost
    # the square of the batch when the planner looped over one set per row of the other,
    # which a prepared statement's plan, made for no batch in particular, does: 10,000
    # messages took 25 s to write, against 0.3 s for a plain INSERT of the same rows.
    enqueue(db_conn, otp("old@example.com"), idempotency_key="old", scope="s")
    enqueue(db_conn, otp(delivery_key="otp:user-1:c1"))
    db_conn.commit()
    messages = [otp(f"user{i}@example.com") for i in range(50)]
    messages += [otp(delivery_key="otp:user-1:c1"), otp(delivery_key="otp:user-1:c2")] * 2
    batch = _prepare(
        [otp("old@example.com"), *messages],
        ["old", *(f"request-{i}" for i in range(len(messages)))],
        "s",
        None,
        None,
        DEFAULT_RECEIPT_TTL_SECONDS,
        "leasebox",
        default_cipher(),
    )
    plan = (generic_plan_of if generic else plan_of)(db_conn, query("enqueue_many"), batch.write[1])
    assert rescans(plan) == []
