"""The plain baseline: what one process can drain with two statements per 100 rows.

It claims 100 ready rows of leasebox's outbox in one `UPDATE ... FOR UPDATE SKIP LOCKED`
statement, "sends" them (a no-op), and marks them sent in one statement guarded by the
lease token. No retries, no metrics, no lease extension, no templates: the practical limit
of this workload on this machine, against which leasebox's own overhead is measured.
Run as `python -m bench.plain_worker work --dsn URL`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import psycopg

from bench.peer_cli import parse
from bench.sqlfiles import bench_query


def drain(dsn: str, batch_size: int) -> int:
    """Drain every ready row; return how many this process sent."""
    sent = 0
    claim = bench_query("baseline_claim")
    mark = bench_query("baseline_mark_sent")
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
    args = parse(argv, "the plain-psycopg drain baseline")
    if args.mode == "work":
        drain(args.dsn, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
