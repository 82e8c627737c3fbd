"""The plain loops: what one process drains with two statements per 100 rows.

Each claims 100 ready rows in one `UPDATE ... FOR UPDATE SKIP LOCKED` statement, "sends"
them (a no-op), and marks them sent in one statement guarded by the lease token. No
retries, no metrics, no lease extension, no templates. On the *minimal* table (a key, a
state, a lease, the payload, one partial index) it is the limit of this workload on this
machine; on *leasebox's own* outbox it is the same loop paying for leasebox's schema, so
the gap between the two is what the schema costs and the gap to leasebox what its worker
costs. Two more loops run leasebox's *own* `claim` and `mark_sent` statements with nothing
around them, once as shipped and once with their attempt-history inserts cut out
(`without_history`), so every run shows what writing the history costs the database. Run as
`python -m bench.plain_worker work --dsn URL [--table minimal|statements|statements-no-history]`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import psycopg

from bench.peer_cli import parse, write_ids
from bench.sqlfiles import bench_query
from leasebox.db.queries import DEFAULT_SCHEMA, compose, named_queries

MINIMAL_SCHEMA = "bench_minimal"
STATEMENTS = {
    "leasebox": ("baseline_claim", "baseline_mark_sent"),
    "minimal": ("minimal_claim", "minimal_mark_sent"),
}


PRODUCT_TABLES = ("statements", "statements-no-history")
# A data-modifying CTE of leasebox's statements that writes the history: `name AS (` up to
# the `)` that closes it alone on a line (a subquery's `) AS l` inside it does not), with the
# comma before it.
_HISTORY_CTE = re.compile(
    r",\n(?:logged|lost|suppressed_logged) AS \(\n"
    r"(?:(?!\n\)).)*INSERT INTO \{schema\}\.history.*?\n\)(?=,|\n|$)",
    re.S,
)


def without_history(text: str) -> str:
    """A leasebox statement with its attempt-history inserts cut out (what it would cost
    without the history); the rest is unchanged."""
    return _HISTORY_CTE.sub("", text)


def product_statements(history: bool) -> tuple[Any, Any]:
    """leasebox's own `claim` and `mark_sent`, as shipped or without their history writes."""
    texts = [named_queries()[name].text for name in ("claim", "mark_sent")]
    if not history:
        texts = [without_history(text) for text in texts]
    claim, mark = (compose(text, DEFAULT_SCHEMA) for text in texts)
    return claim, mark


def drain(dsn: str, batch_size: int, table: str = "leasebox", seen: list[int] | None = None) -> int:
    """Drain every ready row of `table`; return how many this process sent. On leasebox's
    schema, which keeps no history of the plain loop's sends, the payload number of every
    job the loop completed is appended to `seen`."""
    if table in PRODUCT_TABLES:
        return _drain_with_product_statements(
            dsn, batch_size, history=table == "statements", seen=seen
        )
    sent = 0
    claim_name, mark_name = STATEMENTS[table]
    if table == "minimal":
        claim = bench_query(claim_name, MINIMAL_SCHEMA)
        mark = bench_query(mark_name, MINIMAL_SCHEMA)
    else:
        claim, mark = bench_query(claim_name), bench_query(mark_name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute(claim, {"limit": batch_size}).fetchall()
            if not rows:
                return sent
            ids = [row[0] for row in rows]
            tokens = [row[1] for row in rows]
            done = conn.execute(mark, {"ids": ids, "tokens": tokens})
            if seen is not None and done.description is not None:
                # Each job's payload number, as the peers record theirs.
                number = {row[0]: row[2]["i"] for row in rows}
                seen.extend(number[outbox_id] for (outbox_id,) in done.fetchall())
            sent += len(ids)


def _drain_with_product_statements(
    dsn: str, batch_size: int, *, history: bool, seen: list[int] | None
) -> int:
    sent = 0
    claim, mark = product_statements(history)
    worker = "bench-statements"
    claiming = {
        "kinds": ["otp"],
        "limit": batch_size,
        "lease_seconds": 45.0,
        "after_at": [None],
        "after_id": [None],
        "priorities": [0],
        "aging": [0.0],
        "aged_limit": 0,
        "worker_id": worker,
        "now": None,
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            cur = conn.execute(claim, claiming)
            if cur.description is None:
                return sent
            names = [column.name for column in cur.description]
            at_id, at_token, at_data = (names.index(n) for n in ("id", "lease_token", "data"))
            rows = cur.fetchall()
            if not rows:
                return sent
            ids = [row[at_id] for row in rows]
            marking = {
                "ids": ids,
                "tokens": [row[at_token] for row in rows],
                "provider_message_ids": [None] * len(rows),
                "worker_id": worker,
                "now": None,
            }
            done = conn.execute(mark, marking).fetchall()
            if seen is not None:
                number = {row[at_id]: row[at_data]["i"] for row in rows}
                seen.extend(number[outbox_id] for outbox_id, _ in done)
            sent += len(ids)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "the plain drain loops")
    if args.mode == "work":
        seen: list[int] = []
        drain(args.dsn, args.batch_size, args.table, seen)
        if args.table != "minimal":
            write_ids(args.ids_file, seen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
