"""The trace's reads: each lookup but the aggregate's stays on an index over a seeded table,
and the async reader the demo uses reads what the command reads."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from leasebox.db.queries import query
from leasebox.store.history import (
    TRACE_SQL,
    Selector,
    TraceRecords,
    read_trace,
    read_traces_async,
)

ROWS = 20000
SEED = """
INSERT INTO leasebox.outbox (kind, aggregate_id, recipient, template, delivery_key, status,
                             attempts, sent_at)
SELECT 'otp', 'user-' || g, 'u' || g || '@example.com', 'otp', 'seed:' || g, 'sent', 1, now()
FROM generate_series(1, %(rows)s) AS g;
INSERT INTO leasebox.receipts (scope, idempotency_key, request_hash, outbox_id, expires_at)
SELECT 'default', 'key-' || id, 'h', id, now() + interval '1 day' FROM leasebox.outbox;
INSERT INTO leasebox.history (outbox_id, event, at, attempt, lease_token, worker_id)
SELECT id, e.event, now(), 1, gen_random_uuid(), 'w1'
FROM leasebox.outbox CROSS JOIN (VALUES ('claimed'), ('sent')) AS e (event);
"""


@pytest.fixture
def seeded(db_conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    for statement in SEED.split(";\n"):
        if statement.strip():
            db_conn.execute(statement, {"rows": ROWS})
    db_conn.commit()
    db_conn.autocommit = True
    for table in ("outbox", "receipts", "history"):
        db_conn.execute(sql.SQL("ANALYZE leasebox.{}").format(sql.Identifier(table)))
    return db_conn


def plan_of(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> str:
    explain = sql.SQL("EXPLAIN (FORMAT JSON) ") + query(name, "leasebox", TRACE_SQL)
    row = conn.execute(explain, params).fetchone()
    assert row is not None
    return json.dumps(row[0])


@pytest.mark.parametrize(
    ("name", "params", "index"),
    [
        ("trace_by_id", {"outbox_id": 17}, "outbox_pkey"),
        ("trace_by_ids", {"outbox_ids": [17, 18]}, "outbox_pkey"),
        ("trace_by_delivery_key", {"delivery_key": "seed:17"}, "outbox_delivery_key_key"),
        (
            "trace_by_idempotency_key",
            {"scope": "default", "idempotency_key": "key-17"},
            "receipts_pkey",
        ),
        ("trace_receipts", {"outbox_ids": [17, 18]}, "receipts_outbox_idx"),
        ("trace_history", {"outbox_ids": [17, 18]}, "history_pkey"),
    ],
)
def test_a_trace_lookup_reads_a_handful_of_rows_by_index(
    seeded: psycopg.Connection[Any], name: str, params: dict[str, Any], index: str
) -> None:
    plan = plan_of(seeded, name, params)
    assert index in plan
    assert "Seq Scan" not in plan


def test_the_lookup_by_aggregate_scans_the_outbox_as_documented(
    seeded: psycopg.Connection[Any],
) -> None:
    params = {"aggregate_id": "user-17", "kind": None, "limit": 20}
    assert "Seq Scan" in plan_of(seeded, "trace_by_aggregate", params)


async def test_the_demos_async_reader_reads_what_the_command_reads(
    seeded: psycopg.Connection[Any], db_dsn: str
) -> None:
    found = read_trace(seeded, Selector(outbox_id=17))
    async with await psycopg.AsyncConnection.connect(db_dsn) as aconn:
        again = await read_traces_async(aconn, [17])
        assert await read_traces_async(aconn, []) == TraceRecords((), (), ())
    assert again == found
    assert [e.event for e in found.events] == ["claimed", "sent"]
    assert [r.idempotency_key for r in found.receipts] == ["key-17"]
