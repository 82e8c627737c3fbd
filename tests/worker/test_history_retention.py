"""The history goes with its messages: retention and purge remove the history of the messages
they remove and nothing else, and the history of a message retention keeps moves with it.
And the statements that write it stay on their indexes, so the history never makes the hot
path scan a table.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox.db.queries import query
from leasebox.store.dead_letters import DeadLetterFilter, purge_dead_letters
from leasebox.store.pruning import prune
from support.history import add_history, count_rows, histories
from support.outbox_rows import insert_receipt
from support.plans import analyze, full_scans, generic_plan_of, indexes, reads
from support.worker_doubles import Insert

WEEK = 7 * 86400


def test_prune_removes_the_history_of_the_messages_it_removes_and_no_other(
    db_conn: psycopg.Connection[Any], db_insert: Insert, db_now: datetime
) -> None:
    # A sent message written by hand has its `sent` history row already.
    old = [
        add_history(db_conn, db_insert(status="sent", sent_at=db_now - timedelta(days=8)), e)
        for e in ("claimed", "retry")
    ]
    recent = add_history(
        db_conn, db_insert(status="sent", sent_at=db_now - timedelta(days=1)), "claimed"
    )
    referenced = add_history(
        db_conn, db_insert(status="sent", sent_at=db_now - timedelta(days=9)), "claimed"
    )
    insert_receipt(db_conn, referenced, "k", expires_at=db_now + timedelta(hours=1))
    waiting = add_history(
        db_conn, db_insert(created_at=db_now - timedelta(days=10)), "claimed", "released"
    )
    db_conn.commit()

    result = prune(db_conn, retention_seconds=WEEK)

    assert (result.sent, result.kept) == (2, 2)
    assert set(histories(db_conn)) == {recent, referenced, waiting}
    assert not set(old) & set(histories(db_conn, old))
    assert count_rows(db_conn) == 6


def test_purge_deletes_the_history_of_the_dead_letters_it_deletes_and_no_other(
    db_conn: psycopg.Connection[Any], db_insert: Insert, db_now: datetime
) -> None:
    def dead(kind: str) -> int:
        row = db_insert(kind=kind, template=kind, status="dead", dead_reason="rejected")
        return add_history(db_conn, row, "claimed", "dead")

    purged = [dead("otp"), dead("otp")]
    kept_kind = dead("invite")
    sent = db_insert(status="sent", sent_at=db_now)

    assert purge_dead_letters(db_conn, DeadLetterFilter(kinds=("otp",)), batch_size=1) == 2

    assert set(histories(db_conn)) == {kept_kind, sent}
    assert not histories(db_conn, purged)
    assert count_rows(db_conn) == 3


SEED = """
WITH m AS (
    INSERT INTO leasebox.outbox (bucket, kind, recipient, template, delivery_key)
    SELECT (now() AT TIME ZONE 'UTC')::date, 'otp', 'u' || g || '@example.com', 'otp',
           'seed:' || g
    FROM generate_series(1, 30000) AS g
    RETURNING id, bucket, kind, delivery_key
),
q AS (
    INSERT INTO leasebox.queue (id, bucket, kind, delivery_key, status, attempts, lease_token,
                                lease_expires_at, leased_by, dead_reason)
    SELECT id, bucket, kind, delivery_key,
           CASE id % 10 WHEN 0 THEN 'processing' ELSE 'dead' END, 1,
           CASE WHEN id % 10 = 0 THEN gen_random_uuid() END,
           CASE WHEN id % 10 = 0 THEN now() + interval '1 minute' END,
           'w', CASE WHEN id % 10 = 1 THEN 'rejected' END
    FROM m WHERE id % 10 IN (0, 1)
),
r AS (
    INSERT INTO leasebox.receipts (scope, idempotency_key, bucket, request_hash, outbox_id,
                                   outbox_bucket, expires_at)
    SELECT 's', 'k' || id, bucket + 1, 'h', id, bucket, now() + interval '1 day' FROM m
)
INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at, attempt, worker_id)
SELECT id, bucket, kind, 'claimed', now(), 1, 'w' FROM m
"""
CLAIMS = """
UPDATE leasebox.history AS h SET lease_token = coalesce(q.lease_token, gen_random_uuid())
FROM leasebox.queue AS q WHERE q.id = h.outbox_id
"""


@pytest.fixture
def seeded(db_conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    db_conn.execute(SEED)
    db_conn.execute(CLAIMS)
    db_conn.commit()
    analyze(db_conn, "outbox", "queue", "history", "receipts")
    return db_conn


def plan(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> Any:
    """The plan a worker runs the statement with (see `generic_plan_of`)."""
    return generic_plan_of(conn, query(name), params)


def held_leases(conn: psycopg.Connection[Any], count: int) -> tuple[list[int], list[Any]]:
    rows = conn.execute(
        "SELECT id, lease_token FROM leasebox.queue WHERE status = 'processing' LIMIT %s",
        (count,),
    ).fetchall()
    conn.rollback()
    return [r[0] for r in rows], [r[1] for r in rows]


@pytest.mark.parametrize(
    ("name", "columns"),
    [
        ("mark_sent", {"provider_message_ids": "p"}),
        ("schedule_retry", {"delays": 1.0, "errors": "e", "error_classes": "timeout"}),
        ("mark_dead", {"reasons": "rejected", "errors": "e", "error_classes": "smtp_550"}),
        ("release_leases", {}),
    ],
)
def test_the_settling_statements_find_rows_and_claims_by_key_and_never_scan(
    seeded: psycopg.Connection[Any], name: str, columns: dict[str, Any]
) -> None:
    ids, tokens = held_leases(seeded, 100)
    params: dict[str, Any] = {"ids": ids, "tokens": tokens, "now": None, "worker_id": "w"}
    params.update({column: [value] * len(ids) for column, value in columns.items()})
    found = plan(seeded, name, params)
    assert not full_scans(seeded, found), reads(found)
    used = indexes(seeded, found)
    # The rows by key; a lost lease's message by key, then its claim in the message's history.
    assert {"queue_pkey", "outbox_pkey", "history_outbox_idx"} <= used, used


def test_purging_dead_letters_finds_their_message_history_and_receipts_by_key(
    seeded: psycopg.Connection[Any],
) -> None:
    params = DeadLetterFilter(limit=50).params()
    found = plan(seeded, "purge_dead_letters", params)
    assert not full_scans(seeded, found) - {"Seq Scan on queue"}, reads(found)
    used = indexes(seeded, found)
    assert {"outbox_pkey", "history_outbox_idx", "receipts_outbox_idx"} <= used, used
