"""A message written with a replacement key supersedes the older pending ones of its key.

"Resend code": the producer's transaction takes the older pending messages of the key out of
the queue, each with a `superseded` history row naming the newer one, so no worker can claim
them once the newer one is committed. A message a worker holds is left to that worker's check
right before the wire (tests/worker/test_supersession_on_the_wire.py). Producers of one key
serialise on its advisory lock, so of two concurrent resends the later supersedes the earlier.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from leasebox import OutboxMessage, enqueue, enqueue_many
from leasebox.db.queries import query
from leasebox.inspection.narrative import render_text
from leasebox.inspection.trace import build_trace
from leasebox.messages import DEFAULT_RECEIPT_TTL_SECONDS
from leasebox.producer.batch import _prepare
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE, default_cipher
from leasebox.store.history import Selector, read_trace
from support.plans import analyze, full_scans, generic_plan_of, indexes, plan_of
from support.waiting import second_while_first_is_open


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


def code(key: str | None = "challenge-1", recipient: str = "ada@example.com") -> OutboxMessage:
    return OutboxMessage(
        kind="otp",
        recipient=recipient,
        aggregate_id="user-1",
        secrets={"code": "493817"},
        replacement_key=key,
    )


def status(conn: psycopg.Connection[Any], outbox_id: int) -> tuple[str, int | None]:
    row = conn.execute(
        "SELECT status, superseded_by FROM leasebox.messages WHERE id = %s", (outbox_id,)
    ).fetchone()
    conn.rollback()
    assert row is not None
    return row[0], row[1]


def queued(conn: psycopg.Connection[Any]) -> set[int]:
    found = {int(r[0]) for r in conn.execute("SELECT id FROM leasebox.queue").fetchall()}
    conn.rollback()
    return found


def superseded_events(conn: psycopg.Connection[Any]) -> list[tuple[int, int, Any]]:
    found = conn.execute(
        "SELECT outbox_id, superseded_by, lease_token FROM leasebox.history"
        " WHERE event = 'superseded' ORDER BY outbox_id"
    ).fetchall()
    conn.rollback()
    return [(int(a), int(b), c) for a, b, c in found]


def test_a_resent_code_supersedes_the_pending_one_when_it_commits(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    old = enqueue(db_conn, code()).outbox_id
    db_conn.commit()

    with psycopg.connect(db_dsn) as producer:
        enqueue(producer, code())
        producer.rollback()  # a resend that did not commit replaces nothing
        assert status(db_conn, old) == ("pending", None)
        new = enqueue(producer, code()).outbox_id
        assert queued(db_conn) == {old}, "replaced before the producer committed"
        producer.commit()

    assert status(db_conn, old) == ("superseded", new)
    assert status(db_conn, new) == ("pending", None)
    assert queued(db_conn) == {new}
    assert superseded_events(db_conn) == [(old, new, None)]


def test_only_the_same_replacement_key_is_superseded(db_conn: psycopg.Connection[Any]) -> None:
    other_key = enqueue(db_conn, code("challenge-2")).outbox_id
    no_key = enqueue(db_conn, code(None)).outbox_id
    old = enqueue(db_conn, code("challenge-1")).outbox_id
    db_conn.commit()

    newer = enqueue(db_conn, code("challenge-1")).outbox_id
    plain = enqueue(db_conn, code(None)).outbox_id
    db_conn.commit()

    assert queued(db_conn) == {other_key, no_key, newer, plain}
    assert status(db_conn, old) == ("superseded", newer)


def test_a_message_a_worker_holds_is_left_to_the_workers_check(
    db_conn: psycopg.Connection[Any],
) -> None:
    held = enqueue(db_conn, code()).outbox_id
    db_conn.execute(
        "UPDATE leasebox.queue SET status = 'processing', lease_token = gen_random_uuid()"
        " WHERE id = %s",
        (held,),
    )
    db_conn.commit()

    newer = enqueue(db_conn, code()).outbox_id
    db_conn.commit()

    assert status(db_conn, held)[0] == "processing"
    assert queued(db_conn) == {held, newer}
    assert superseded_events(db_conn) == []


def test_a_retried_request_of_the_newer_code_supersedes_nothing_again(
    db_conn: psycopg.Connection[Any],
) -> None:
    old = enqueue(db_conn, code()).outbox_id
    db_conn.commit()
    first = enqueue(db_conn, code(), idempotency_key="resend-1", scope="login")
    db_conn.commit()

    again = enqueue(db_conn, code(), idempotency_key="resend-1", scope="login")
    db_conn.commit()

    assert again.reused
    assert again.outbox_id == first.outbox_id
    assert status(db_conn, first.outbox_id) == ("pending", None)
    assert superseded_events(db_conn) == [(old, first.outbox_id, None)]


def test_of_two_concurrent_resends_the_later_waits_for_the_earlier_and_supersedes_it(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    first = psycopg.connect(db_dsn)
    earlier = enqueue(first, code()).outbox_id

    later = second_while_first_is_open(
        db_dsn, db_conn, first, lambda conn: enqueue(conn, code()).outbox_id
    )

    assert later > earlier
    assert status(db_conn, earlier) == ("superseded", later)
    assert queued(db_conn) == {later}


def test_a_batch_supersedes_the_pending_codes_and_its_own_earlier_code_of_a_key(
    db_conn: psycopg.Connection[Any],
) -> None:
    old = enqueue(db_conn, code("a")).outbox_id
    untouched = enqueue(db_conn, code("b")).outbox_id
    db_conn.commit()

    receipts = enqueue_many(
        db_conn, [code("a", "x@example.com"), code("c"), code("a", "y@example.com"), code(None)]
    )
    db_conn.commit()

    first_a, only_c, last_a, plain = (r.outbox_id for r in receipts)
    assert queued(db_conn) == {untouched, only_c, last_a, plain}
    assert status(db_conn, old) == ("superseded", last_a)
    assert status(db_conn, first_a) == ("superseded", last_a), "written, never queued"
    assert [(o, n) for o, n, _ in superseded_events(db_conn)] == [
        (old, last_a),
        (first_a, last_a),
    ]


def test_the_trace_of_a_superseded_code_names_the_newer_message(
    db_conn: psycopg.Connection[Any],
) -> None:
    old = enqueue(db_conn, code()).outbox_id
    db_conn.commit()
    new = enqueue(db_conn, code()).outbox_id
    db_conn.commit()

    selector = Selector(outbox_id=old)
    trace = build_trace(read_trace(db_conn, selector), selector)
    text = render_text(trace)

    [story] = trace.sends
    assert (story.status, story.superseded_by) == ("superseded", new)
    assert story.attempts == ()
    assert f"superseded by outbox id {new} (replacement key challenge-1)" in text
    assert f"superseded by outbox id {new} at" in text
    assert "while pending" in text


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_superseding_reads_the_keys_rows_by_index(
    db_conn: psycopg.Connection[Any], generic: bool
) -> None:
    enqueue_many(db_conn, [code(f"k{i}", f"u{i}@example.com") for i in range(300)])
    db_conn.commit()
    analyze(db_conn, "queue", "outbox")
    batch = _prepare(
        [code("k1"), code("k2")],
        None,
        None,
        None,
        None,
        DEFAULT_RECEIPT_TTL_SECONDS,
        "leasebox",
        default_cipher(),
    )

    plan = (generic_plan_of if generic else plan_of)(db_conn, query("enqueue_many"), batch.write[1])

    assert not [s for s in full_scans(db_conn, plan) if "queue" in s]
    assert "queue_replacement_idx" in indexes(db_conn, plan)


def test_the_check_before_the_wire_reads_the_outbox_by_its_replacement_index(
    db_conn: psycopg.Connection[Any],
) -> None:
    enqueue_many(db_conn, [code(f"k{i}", f"u{i}@example.com") for i in range(300)])
    db_conn.commit()
    analyze(db_conn, "outbox")
    params = {"replacement_key": "k7", "id": 1, "created_at": datetime.now(UTC)}

    plan = plan_of(db_conn, query("newer_replacement"), params)

    assert not [s for s in full_scans(db_conn, plan) if "outbox" in s]
    assert any(
        name.startswith("outbox") and "replacement" in name for name in indexes(db_conn, plan)
    )
