"""The claim and the settling statements have the same plan whether or not the queue has
statistics: a burst into a queue that autovacuum has not analysed yet drains as fast as any.

A queue after a quiet night holds a burst its statistics know nothing about (autovacuum
analyses a table only once enough of it changed, and then at its next naptime). The plan
of each hot statement is read in that state and after an ANALYZE: the shape, never a speed.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from leasebox.db.queries import query
from support.plans import (
    CLAIM_PARAMETERS,
    analyze,
    full_scans,
    generic_plan_of,
    indexes,
    nodes,
    reads,
)

# A burst big enough for a planner without statistics to claim through the wrong index
# before migration 0009 (50,000 rows, not 20,000), and a small one, whose day partition a
# planner without statistics read in full to join it to a batch.
BURST = 50_000
SMALL_BURST = 3_000
# The burst as `enqueue_many` writes it: a message and its queue row each, ready now.
SEED = """
WITH m AS (
    INSERT INTO leasebox.outbox (bucket, kind, recipient, template, delivery_key)
    SELECT (now() AT TIME ZONE 'UTC')::date, 'otp', 'user' || g || '@example.com', 'otp',
           'otp:' || g
    FROM generate_series(1, %(rows)s) AS g
    RETURNING id, bucket, kind, delivery_key, created_at
)
INSERT INTO leasebox.queue (id, bucket, kind, delivery_key, available_at, created_at)
SELECT id, bucket, kind, delivery_key, created_at, created_at FROM m
"""
SETTLING: dict[str, dict[str, Any]] = {
    "mark_sent": {"provider_message_ids": [None, None]},
    "schedule_retry": {"delays": [1.0, 1.0], "errors": ["e", "e"], "error_classes": ["x", "x"]},
    "mark_dead": {"reasons": ["r", "r"], "errors": ["e", "e"], "error_classes": ["x", "x"]},
    "release_leases": {},
}


def _never_analysed(conn: psycopg.Connection[Any], rows: int) -> psycopg.Connection[Any]:
    # Autovacuum stays away from the queue, as it does until its next naptime after a burst.
    conn.execute("ALTER TABLE leasebox.queue SET (autovacuum_enabled = false)")
    conn.commit()
    conn.execute(SEED, {"rows": rows})
    conn.commit()
    row = conn.execute(
        "SELECT c.reltuples, s.last_analyze, s.last_autoanalyze"
        " FROM pg_catalog.pg_class AS c"
        " JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = c.oid"
        " WHERE c.oid = 'leasebox.queue'::regclass"
    ).fetchone()
    conn.rollback()
    assert row == (-1, None, None), "the queue has statistics: the case is not the one tested"
    return conn


STATES = [
    pytest.param((BURST, False), id="never analysed"),
    pytest.param((BURST, True), id="analysed"),
]


@pytest.fixture
def burst(request: pytest.FixtureRequest, db_conn: psycopg.Connection[Any]) -> Any:
    rows, analysed = request.param
    conn = _never_analysed(db_conn, rows)
    if analysed:
        analyze(conn, "queue", "outbox", "history")
    return conn


def _locked_scan(plan: Any) -> dict[str, Any]:
    """What the claim locks its rows as it reads them from: the node under its LockRows."""
    [locking] = [node for node in nodes(plan) if node["Node Type"] == "LockRows"]
    [scan] = locking["Plans"]
    return dict(scan)


@pytest.mark.parametrize(
    "burst",
    [*STATES, pytest.param((SMALL_BURST, False), id="small, never analysed")],
    indirect=True,
)
@pytest.mark.parametrize("name", ["claim", "claim_without_content"])
def test_the_claim_reads_its_batch_in_the_ready_index_order_whatever_the_statistics(
    burst: psycopg.Connection[Any], name: str
) -> None:
    plan = generic_plan_of(burst, query(name), CLAIM_PARAMETERS)
    scan = _locked_scan(plan)
    # Read in the claim's order and locked as read: no sort of every pending row before it.
    assert (scan["Node Type"], scan.get("Index Name")) == ("Index Scan", "queue_ready_idx"), scan
    assert "kind = k.kind" in scan["Index Cond"]
    # Otherwise the queue is read only by its key (the claimed rows' update).
    assert {i for i in indexes(burst, plan) if i.startswith("queue")} == {
        "queue_ready_idx",
        "queue_pkey",
    }
    assert not full_scans(burst, plan), reads(plan)


@pytest.mark.parametrize("burst", STATES, indirect=True)
@pytest.mark.parametrize("name", sorted(SETTLING))
def test_a_settling_statement_finds_each_row_by_its_key_whatever_the_statistics(
    burst: psycopg.Connection[Any], name: str
) -> None:
    claimed = burst.execute(
        query("claim_without_content"), {**CLAIM_PARAMETERS, "limit": 2}
    ).fetchall()
    burst.commit()
    params = {
        **SETTLING[name],
        "ids": [row[0] for row in claimed],
        "tokens": [row[11] for row in claimed],
        "worker_id": "w",
        "now": None,
    }
    plan = generic_plan_of(burst, query(name), params)
    assert "Seq Scan on queue" not in reads(plan)
    assert {i for i in indexes(burst, plan) if i.startswith("queue")} == {"queue_pkey"}, reads(plan)
