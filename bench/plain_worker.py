"""The plain loops: what one process drains with two statements per 100 rows.

Each claims 100 ready rows in one `UPDATE ... FOR UPDATE SKIP LOCKED` statement, "sends"
them (a no-op), and marks them sent in one statement guarded by the lease token. No
retries, no metrics, no lease extension, no templates. On the *minimal* table (a key, a
state, a lease, the payload, one partial index) it is the limit of this workload on this
machine; on *leasebox's own* outbox it is the same loop paying for leasebox's schema, so
the gap between the two is what the schema costs and the gap to leasebox what its worker
costs. Run as `python -m bench.plain_worker work --dsn URL [--table minimal]`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import psycopg

from bench.peer_cli import parse
from bench.sqlfiles import bench_query

MINIMAL_SCHEMA = "bench_minimal"
STATEMENTS = {
    "leasebox": ("baseline_claim", "baseline_mark_sent"),
    "minimal": ("minimal_claim", "minimal_mark_sent"),
}


def drain(dsn: str, batch_size: int, table: str = "leasebox") -> int:
    """Drain every ready row of `table`; return how many this process sent."""
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
            conn.execute(mark, {"ids": ids, "tokens": tokens})
            sent += len(ids)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "the plain drain loops")
    if args.mode == "work":
        drain(args.dsn, args.batch_size, args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
