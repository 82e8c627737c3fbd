"""The backlog query reports the right figures, and the hot queries stay on their indexes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox import OutboxMessage, enqueue
from leasebox.db.partitions import ensure_partitions, list_partitions
from leasebox.db.queries import query
from leasebox.store.backlog import fetch_backlog, fetch_backlog_async
from support.outbox_rows import SEALING, insert_message, otp
from support.plans import (
    CLAIM_PARAMETERS,
    analyze,
    full_scans,
    generic_plan_of,
    indexes,
    nodes,
    plan_of,
    reads,
)

SEED = """
WITH m AS (
    INSERT INTO leasebox.outbox (bucket, kind, recipient, recipient_key, scope, template,
                                 delivery_key, created_at)
    SELECT (t.at AT TIME ZONE 'UTC')::date,
           CASE WHEN g %% 3 = 0 THEN 'otp' ELSE 'invite' END, 'U' || g || '@example.com',
           'u' || g || '@example.com', 'tenant-' || g %% 500, 'otp', 'seed:' || g, t.at
    FROM generate_series(1, %(sent)s) AS g
    CROSS JOIN LATERAL (
        SELECT now() - CASE WHEN g %% 2 = 0 THEN interval '3 days' ELSE interval '2 hours' END
    ) AS t(at)
    RETURNING id, bucket, kind, created_at
)
INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at, attempt)
SELECT id, bucket, kind, 'sent', created_at + interval '1 second', 1 FROM m
"""
# The queue of a busy outbox: most rows waiting, some held by workers, a few dead letters.
SEED_QUEUE = """
WITH m AS (
    INSERT INTO leasebox.outbox (bucket, kind, recipient, template, delivery_key, created_at)
    SELECT (now() AT TIME ZONE 'UTC')::date, CASE WHEN g %% 4 = 0 THEN 'invite' ELSE 'otp' END,
           'p' || g || '@example.com', 'otp', 'queued:' || g, now() - make_interval(secs => g)
    FROM generate_series(1, %(queued)s) AS g
    RETURNING id, bucket, kind, delivery_key, created_at
)
INSERT INTO leasebox.queue (id, bucket, kind, delivery_key, available_at, created_at, status,
                            lease_token, lease_expires_at, dead_reason)
SELECT id, bucket, kind, delivery_key, created_at, created_at,
       CASE id %% 20 WHEN 0 THEN 'processing' WHEN 1 THEN 'dead' ELSE 'pending' END,
       CASE WHEN id %% 20 = 0 THEN gen_random_uuid() END,
       CASE WHEN id %% 20 = 0 THEN now() + interval '1 minute' END,
       CASE WHEN id %% 20 = 1 THEN 'rejected' END
FROM m
"""


def plan(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> Any:
    return plan_of(conn, query(name), params)


def test_backlog_counts_states_and_ages(db_conn: psycopg.Connection[Any]) -> None:
    now = datetime.now(UTC)
    enqueue(db_conn, otp("a@example.com"), cipher=SEALING)
    enqueue(db_conn, otp("b@example.com", available_at=now + timedelta(minutes=5)), cipher=SEALING)
    invitation = {"inviter": "Ada", "link": "https://example.com/i/1"}
    enqueue(db_conn, OutboxMessage(kind="invite", recipient="c@example.com", data=invitation))
    db_conn.execute(
        "UPDATE leasebox.queue SET created_at = now() - interval '30 seconds',"
        " available_at = now() - interval '20 seconds'"
        " WHERE id = (SELECT id FROM leasebox.outbox WHERE recipient = 'a@example.com')"
    )
    db_conn.execute(
        "UPDATE leasebox.queue SET status = 'processing', lease_token = gen_random_uuid(),"
        " lease_expires_at = now() - interval '1 second'"
        " WHERE id = (SELECT id FROM leasebox.outbox WHERE recipient = 'c@example.com')"
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


def test_the_send_rate_counts_the_windows_sends_of_the_messages_of_the_last_day(
    db_conn: psycopg.Connection[Any],
) -> None:
    now = datetime.now(UTC)
    recently = now - timedelta(seconds=5)

    def sent(created_at: datetime, sent_at: datetime, kind: str = "otp") -> None:
        insert_message(
            db_conn, status="sent", kind=kind, recipient="a@example.com", template=kind,
            delivery_key=f"key-{created_at}-{sent_at}-{kind}", created_at=created_at,
            sent_at=sent_at,
        )  # fmt: skip

    for created_at in (now, now - timedelta(hours=20), now - timedelta(days=3)):
        sent(created_at, recently)
    sent(now - timedelta(minutes=5), now - timedelta(minutes=5))  # before the window
    sent(now, recently, kind="invite")
    db_conn.commit()
    ensure_partitions(db_conn)  # the earlier days get partitions of their own
    backlog = fetch_backlog(db_conn, ["otp"], window_seconds=60)
    # A send of a message created days before (a requeued dead letter) is left out of the rate.
    assert backlog.kinds[0].sent_in_window == 2
    assert backlog.sent_per_second == 2 / 60


async def test_the_async_backlog_matches_the_sync_one(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        enqueue(conn, otp("a@example.com"), cipher=SEALING)
        conn.commit()
        sync = fetch_backlog(conn, ["otp"])
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        backlog = await fetch_backlog_async(conn, ["otp"])
    assert (backlog.pending, backlog.ready) == (sync.pending, sync.ready) == (1, 1)


@pytest.fixture
def seeded(db_conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    db_conn.execute(SEED, {"sent": 30_000})
    db_conn.execute(SEED_QUEUE, {"queued": 20_000})
    db_conn.commit()
    # The days before today get partitions of their own, as the maintenance gives them.
    ensure_partitions(db_conn)
    analyze(db_conn, "outbox", "queue", "history")
    return db_conn


def worker_plan(conn: psycopg.Connection[Any], name: str, **params: Any) -> Any:
    """The plan a worker claims with: the generic plan (the worker's `plan_cache_mode`)."""
    return generic_plan_of(conn, query(name), {**CLAIM_PARAMETERS, **params})


def test_a_claim_with_a_cursor_starts_its_index_scan_at_the_cursor(
    seeded: psycopg.Connection[Any],
) -> None:
    cursor = {"after_at": [datetime.now(UTC) - timedelta(minutes=1)], "after_id": [1000]}
    found = worker_plan(seeded, "claim_without_content", **cursor)
    [scan] = [n for n in nodes(found) if n.get("Index Name") == "queue_ready_idx"]
    # The cursor bounds the scan itself (an index condition), not a filter applied to every
    # entry the scan walks past.
    assert "ROW(available_at, id) > ROW(" in scan["Index Cond"]
    assert "kind = k.kind" in scan["Index Cond"]


@pytest.mark.parametrize("name", ["claim", "claim_without_content"])
def test_the_claim_uses_the_ready_index_and_never_scans_a_table(
    seeded: psycopg.Connection[Any], name: str
) -> None:
    found = worker_plan(seeded, name)
    assert {"queue_ready_idx", "queue_pkey"} <= indexes(seeded, found)
    assert not full_scans(seeded, found), reads(found)


@pytest.mark.parametrize("name", ["claim", "claim_without_content"])
def test_a_claim_with_priorities_reads_each_kind_by_the_ready_index_and_sorts_its_candidates(
    seeded: psycopg.Connection[Any], name: str
) -> None:
    # Urgent otp before invite, with aging and a share for aged rows: each kind is still one
    # scan of the ready index from its cursor, and only the kinds' first rows are ordered.
    urgent = {
        "kinds": ["otp", "invite"],
        "after_at": [None, None],
        "after_id": [None, None],
        "priorities": [10, 0],
        "aging": [30.0, 600.0],
        "aged_limit": 25,
    }
    found = worker_plan(seeded, name, **urgent)
    assert {"queue_ready_idx", "queue_pkey"} <= indexes(seeded, found)
    assert not full_scans(seeded, found), reads(found)
    [scan] = [n for n in nodes(found) if n.get("Index Name") == "queue_ready_idx"]
    assert "kind = k.kind" in scan["Index Cond"]
    assert [n["Node Type"] for n in nodes(scan)] == ["Index Scan"]  # nothing sorts the table
    limited = [n for n in nodes(found) if n["Node Type"] == "Limit"]
    assert any(scan in nodes(n) for n in limited), "each kind's scan stops at the claim's limit"


def test_the_claim_reads_each_message_by_its_key_in_its_days_partition(
    seeded: psycopg.Connection[Any],
) -> None:
    found = worker_plan(seeded, "claim")
    assert "outbox_pkey" in indexes(seeded, found)
    # Without content, a claim reads the outbox only to check the suppression list, and only
    # while the list holds an entry: a one-time filter gates that part of the plan.
    without = worker_plan(seeded, "claim_without_content")
    [barred] = [n for n in nodes(without) if n.get("Subplan Name") == "CTE barred"]
    gate = [n for n in nodes(barred) if "One-Time Filter" in n]
    assert gate, barred
    assert "outbox_pkey" in indexes(seeded, gate[0])
    barred["Plans"] = []
    assert "outbox_pkey" not in indexes(seeded, without)


def test_the_backlog_query_reads_the_queue_and_the_send_index_never_what_is_kept(
    seeded: psycopg.Connection[Any],
) -> None:
    found = plan(seeded, "backlog", {"kinds": ["otp", "invite"], "window_seconds": 60})
    # The queue holds only unsent messages: counting its pending rows may read all of it.
    assert full_scans(seeded, found) <= {"Seq Scan on queue"}, reads(found)
    assert not [r for r in reads(found) if "outbox" in r], reads(found)
    used = indexes(seeded, found)
    assert {i for i in used if i.startswith("history")} == {"history_sent_idx"}, used
    # The history of the days before yesterday is not read at all (its partitions are pruned).
    three_days_ago = (datetime.now(UTC) - timedelta(days=3)).date()
    assert f"history_{three_days_ago:%Y%m%d}" in {
        p.name for p in list_partitions(seeded, "history")
    }
    assert not [r for r in reads(found) if f"history_{three_days_ago:%Y%m%d}" in r], reads(found)
    for index in ("queue_leases_idx", "queue_dead_idx"):
        assert index in used, f"{index} unused: {used}"


def test_reclaiming_expired_leases_uses_the_lease_index(seeded: psycopg.Connection[Any]) -> None:
    found = plan(
        seeded, "reclaim_expired_leases", {"now": None, "limit": 100, "default_max_attempts": 8}
    )
    assert "queue_leases_idx" in indexes(seeded, found)
    assert not full_scans(seeded, found), reads(found)


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
def test_the_abuse_guard_counts_on_its_indexes_in_the_windows_days_alone(
    seeded: psycopg.Connection[Any], name: str, params: dict[str, Any], index: str
) -> None:
    found = plan(seeded, name, {**params, "window_seconds": 3600})
    assert index in indexes(seeded, found)
    assert not full_scans(seeded, found), reads(found)
    # The days before the window are not read at all (their partitions are pruned).
    three_days_ago = (datetime.now(UTC) - timedelta(days=3)).date()
    assert not [r for r in reads(found) if f"outbox_{three_days_ago:%Y%m%d}" in r], reads(found)
