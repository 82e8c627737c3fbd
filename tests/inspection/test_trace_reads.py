"""The trace's reads: each lookup but the aggregate's stays on an index over a seeded table,
and the async reader the demo uses reads what the command reads."""

from __future__ import annotations

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
from support.plans import full_scans, indexes, plan_of, reads

ROWS = 20000
SEED = """
WITH m AS (
    INSERT INTO leasebox.outbox (bucket, kind, aggregate_id, recipient, template, delivery_key)
    SELECT (now() AT TIME ZONE 'UTC')::date, 'otp', 'user-' || g, 'u' || g || '@example.com',
           'otp', 'seed:' || g
    FROM generate_series(1, %(rows)s) AS g
    RETURNING id, bucket, kind
),
r AS (
    INSERT INTO leasebox.receipts (scope, idempotency_key, bucket, request_hash, outbox_id,
                                   outbox_bucket, expires_at)
    SELECT 'default', 'key-' || id, bucket + 1, 'h', id, bucket, now() + interval '1 day'
    FROM m
)
INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at, attempt, lease_token,
                              worker_id)
SELECT id, bucket, kind, e.event, now(), 1, gen_random_uuid(), 'w1'
FROM m CROSS JOIN (VALUES ('claimed'), ('sent')) AS e (event)
"""


@pytest.fixture
def seeded(db_conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    db_conn.execute(SEED, {"rows": ROWS})
    db_conn.commit()
    db_conn.autocommit = True
    for table in ("outbox", "queue", "receipts", "history"):
        db_conn.execute(sql.SQL("ANALYZE leasebox.{}").format(sql.Identifier(table)))
    return db_conn


def plan(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> Any:
    return plan_of(conn, query(name, "leasebox", TRACE_SQL), params)


@pytest.mark.parametrize(
    ("name", "params", "index"),
    [
        ("trace_by_id", {"outbox_id": 17}, "outbox_pkey"),
        ("trace_by_ids", {"outbox_ids": [17, 18]}, "outbox_pkey"),
        ("trace_by_delivery_key", {"delivery_key": "seed:17"}, "outbox_delivery_key_bucket_key"),
        (
            "trace_by_idempotency_key",
            {"scope": "default", "idempotency_key": "key-17"},
            "receipts_pkey",
        ),
        ("trace_receipts", {"outbox_ids": [17, 18]}, "receipts_outbox_idx"),
        ("trace_history", {"outbox_ids": [17, 18]}, "history_outbox_idx"),
    ],
)
def test_a_trace_lookup_reads_a_handful_of_rows_by_index(
    seeded: psycopg.Connection[Any], name: str, params: dict[str, Any], index: str
) -> None:
    found = plan(seeded, name, params)
    assert index in indexes(seeded, found)
    assert not full_scans(seeded, found), reads(found)


def test_the_lookup_by_aggregate_scans_the_outbox_as_documented(
    seeded: psycopg.Connection[Any],
) -> None:
    params = {"aggregate_id": "user-17", "kind": None, "limit": 20}
    assert full_scans(seeded, plan(seeded, "trace_by_aggregate", params))


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
