"""The history goes with its rows: prune and purge delete the history of the rows they delete
and nothing else, in the same statement. And the statements that write it stay on their
indexes, so the history never makes the hot path scan a table.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox.db.queries import query
from leasebox.store.dead_letters import DeadLetterFilter, purge_dead_letters
from leasebox.store.pruning import prune
from support.history import count_rows, histories
from support.worker_doubles import Insert

WEEK = 7 * 86400


def with_history(conn: psycopg.Connection[Any], outbox_id: int, *events: str) -> int:
    """Give a row some history (as its statements would have written it); returns its id."""
    for event in events:
        conn.execute(
            "INSERT INTO leasebox.history (outbox_id, event, at) VALUES (%s, %s, now())",
            (outbox_id, event),
        )
    conn.commit()
    return outbox_id


def test_prune_deletes_the_history_of_the_rows_it_deletes_and_no_other(
    db_conn: psycopg.Connection[Any], db_insert: Insert, db_now: datetime
) -> None:
    old = [
        with_history(
            db_conn, db_insert(status="sent", sent_at=db_now - timedelta(days=8)), e, "sent"
        )
        for e in ("claimed", "retry")
    ]
    recent = with_history(
        db_conn, db_insert(status="sent", sent_at=db_now - timedelta(days=1)), "claimed", "sent"
    )
    referenced = with_history(
        db_conn, db_insert(status="sent", sent_at=db_now - timedelta(days=9)), "claimed", "sent"
    )
    db_conn.execute(
        "INSERT INTO leasebox.receipts (scope, idempotency_key, request_hash, outbox_id,"
        " expires_at) VALUES ('s', 'k', 'h', %s, now() + interval '1 hour')",
        (referenced,),
    )
    pending = with_history(db_conn, db_insert(), "claimed", "released")
    db_conn.commit()

    result = prune(db_conn, retention_seconds=WEEK, batch_size=1)

    assert result.sent == 2
    assert set(histories(db_conn)) == {recent, referenced, pending}
    assert not set(old) & set(histories(db_conn, old))
    assert count_rows(db_conn) == 6


def test_purge_deletes_the_history_of_the_dead_letters_it_deletes_and_no_other(
    db_conn: psycopg.Connection[Any], db_insert: Insert
) -> None:
    def dead(kind: str) -> int:
        row = db_insert(kind=kind, template=kind, status="dead", dead_reason="rejected")
        return with_history(db_conn, row, "claimed", "dead")

    purged = [dead("otp"), dead("otp")]
    kept_kind = dead("invite")
    sent = with_history(db_conn, db_insert(status="sent", sent_at=db_now_of(db_conn)), "sent")

    assert purge_dead_letters(db_conn, DeadLetterFilter(kinds=("otp",)), batch_size=1) == 2

    assert set(histories(db_conn)) == {kept_kind, sent}
    assert not histories(db_conn, purged)
    assert count_rows(db_conn) == 3


def db_now_of(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    conn.rollback()
    assert row is not None
    value: datetime = row[0]
    return value


SEED = """
INSERT INTO leasebox.outbox (kind, recipient, template, delivery_key, status, attempts,
                             lease_token, lease_expires_at, leased_by, sent_at, dead_reason)
SELECT 'otp', 'u' || g || '@example.com', 'otp', 'seed:' || g,
       CASE g % 10 WHEN 0 THEN 'processing' WHEN 1 THEN 'dead' ELSE 'sent' END, 1,
       CASE WHEN g % 10 = 0 THEN gen_random_uuid() END,
       CASE WHEN g % 10 = 0 THEN now() + interval '1 minute' END,
       'w',
       CASE WHEN g % 10 > 1 THEN now() - interval '1 hour' END,
       CASE WHEN g % 10 = 1 THEN 'rejected' END
FROM generate_series(1, 30000) AS g
"""
SEED_HISTORY = """
INSERT INTO leasebox.history (outbox_id, event, at, attempt, lease_token, worker_id)
SELECT id, 'claimed', now(), 1, coalesce(lease_token, gen_random_uuid()), 'w'
FROM leasebox.outbox
"""


@pytest.fixture
def seeded(db_conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    db_conn.execute(SEED)
    db_conn.execute(SEED_HISTORY)
    db_conn.commit()
    db_conn.execute("ANALYZE leasebox.outbox")
    db_conn.execute("ANALYZE leasebox.history")
    db_conn.commit()
    return db_conn


def scans(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> set[str]:
    """How the statement's plan reads each table: `Seq Scan on outbox`, `Index Scan using ...`."""
    explain = psycopg.sql.SQL("EXPLAIN (FORMAT JSON) ") + query(name)
    row = conn.execute(explain, params).fetchone()
    conn.rollback()
    assert row is not None
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node and node["Node Type"] != "ModifyTable":
            how = node.get("Index Name")
            what = f"using {how}" if how else f"on {node['Relation Name']}"
            found.add(f"{node['Node Type']} {what}")
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return found


def held_leases(conn: psycopg.Connection[Any], count: int) -> tuple[list[int], list[Any]]:
    rows = conn.execute(
        "SELECT id, lease_token FROM leasebox.outbox WHERE status = 'processing' LIMIT %s",
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
    found = scans(seeded, name, params)
    assert not {s for s in found if s.startswith("Seq Scan")}, found
    assert any("outbox_pkey" in s for s in found), found
    assert any("history_pkey" in s for s in found), found  # a lost lease's claim, by key


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("prune_sent", {"retention_seconds": 60, "limit": 50}),
        (
            "purge_dead_letters",
            {"kinds": None, "reason": None, "older_than_seconds": None, "ids": None, "limit": 50},
        ),
    ],
)
def test_deleting_rows_deletes_their_history_by_its_key(
    seeded: psycopg.Connection[Any], name: str, params: dict[str, Any]
) -> None:
    found = scans(seeded, name, params)
    assert "Seq Scan on history" not in found, found
    assert any("history_pkey" in s for s in found), found
