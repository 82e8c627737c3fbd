"""The backlog query reports the right figures, and the hot queries stay on their indexes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox import OutboxMessage, enqueue
from leasebox.db.queries import query
from leasebox.store.backlog import fetch_backlog, fetch_backlog_async

SEED = """
INSERT INTO leasebox.outbox (kind, recipient, recipient_key, scope, template, delivery_key,
                             status, sent_at, available_at, created_at)
SELECT CASE WHEN g %% 3 = 0 THEN 'otp' ELSE 'invite' END, 'U' || g || '@example.com',
       'u' || g || '@example.com', 'tenant-' || g %% 500, 'otp', 'seed:' || g, 'sent',
       now() - interval '1 hour', now() - interval '2 hours', now() - interval '2 hours'
FROM generate_series(1, %(sent)s) AS g
"""
SEED_PENDING = """
INSERT INTO leasebox.outbox (kind, recipient, template, delivery_key, available_at, created_at)
SELECT 'otp', 'p' || g || '@example.com', 'otp', 'pending:' || g,
       now() - make_interval(secs => g), now() - make_interval(secs => g)
FROM generate_series(1, %(pending)s) AS g
"""


def plan_of(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> str:
    statement = query(name)
    explain = psycopg.sql.SQL("EXPLAIN (FORMAT JSON) ") + statement
    row = conn.execute(explain, params).fetchone()
    assert row is not None
    return json.dumps(row[0])


def test_backlog_counts_states_and_ages(db_conn: psycopg.Connection[Any]) -> None:
    now = datetime.now(UTC)
    enqueue(db_conn, OutboxMessage(kind="otp", recipient="a@example.com"))
    enqueue(
        db_conn,
        OutboxMessage(
            kind="otp", recipient="b@example.com", available_at=now + timedelta(minutes=5)
        ),
    )
    enqueue(db_conn, OutboxMessage(kind="invite", recipient="c@example.com"))
    db_conn.execute(
        "UPDATE leasebox.outbox SET created_at = now() - interval '30 seconds',"
        " available_at = now() - interval '20 seconds' WHERE recipient = 'a@example.com'"
    )
    db_conn.execute(
        "UPDATE leasebox.outbox SET status = 'processing', lease_token = gen_random_uuid(),"
        " lease_expires_at = now() - interval '1 second' WHERE recipient = 'c@example.com'"
    )
    db_conn.commit()

    otp_only = fetch_backlog(db_conn, ["otp"])
    both = fetch_backlog(db_conn, ["otp", "invite"])

    assert (otp_only.pending, otp_only.ready, otp_only.processing) == (2, 1, 0)
    assert 29 <= otp_only.oldest_pending_age_seconds <= 60
    assert 19 <= otp_only.oldest_ready_age_seconds <= 50
    assert (both.pending, both.processing, both.expired_leases) == (2, 1, 1)
    assert [k.kind for k in both.kinds] == ["invite", "otp"]


def test_an_empty_backlog_has_zero_ages(db_conn: psycopg.Connection[Any]) -> None:
    backlog = fetch_backlog(db_conn, ["otp"])
    assert backlog.pending == 0
    assert backlog.oldest_pending_age_seconds == 0.0
    assert backlog.as_dict()["oldestReadyAgeSeconds"] == 0.0


def test_the_backlog_needs_at_least_one_kind(db_conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValueError, match="at least one kind"):
        fetch_backlog(db_conn, [])


async def test_the_async_backlog_matches_the_sync_one(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        enqueue(conn, OutboxMessage(kind="otp", recipient="a@example.com"))
        conn.commit()
        sync = fetch_backlog(conn, ["otp"])
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        backlog = await fetch_backlog_async(conn, ["otp"])
    assert (backlog.pending, backlog.ready) == (sync.pending, sync.ready) == (1, 1)


@pytest.fixture
def seeded(db_conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    db_conn.execute(SEED, {"sent": 30_000})
    db_conn.execute(SEED_PENDING, {"pending": 2_000})
    db_conn.commit()
    db_conn.execute("ANALYZE leasebox.outbox")
    return db_conn


def test_the_claim_uses_the_ready_index_and_never_scans_the_table(
    seeded: psycopg.Connection[Any],
) -> None:
    plan = plan_of(
        seeded,
        "claim",
        {"kinds": ["otp"], "now": None, "limit": 100, "lease_seconds": 45, "worker_id": "w"},
    )
    assert "outbox_ready_idx" in plan
    assert "Seq Scan" not in plan


def test_the_backlog_query_is_served_by_partial_indexes(seeded: psycopg.Connection[Any]) -> None:
    plan = plan_of(seeded, "backlog", {"kinds": ["otp", "invite"], "window_seconds": 60})
    assert "Seq Scan" not in plan.replace('"Function Scan"', "")
    for index in ("outbox_ready_idx", "outbox_leases_idx", "outbox_dead_idx", "outbox_sent_idx"):
        assert index in plan, f"{index} unused: {plan}"


def test_reclaiming_expired_leases_uses_the_lease_index(seeded: psycopg.Connection[Any]) -> None:
    plan = plan_of(
        seeded, "reclaim_expired_leases", {"now": None, "limit": 100, "default_max_attempts": 8}
    )
    assert "outbox_leases_idx" in plan
    assert "Seq Scan" not in plan


@pytest.mark.parametrize(
    ("name", "params", "index"),
    [
        (
            "count_recipient_window",
            {"recipient_key": "u7@example.com"},
            "outbox_recipient_key_created_idx",
        ),
        ("count_scope_window", {"scope": "tenant-7"}, "outbox_scope_created_idx"),
    ],
)
def test_the_abuse_guard_counts_on_its_indexes(
    seeded: psycopg.Connection[Any], name: str, params: dict[str, Any], index: str
) -> None:
    plan = plan_of(seeded, name, {**params, "window_seconds": 3600})
    assert index in plan
    assert "Seq Scan" not in plan
