"""The table-scale benchmark: claim and backlog query beside 10,000 and 1,000,000 sent rows.

Sent rows stay in the outbox until pruning, so the hot queries must cost the same whatever
the table keeps. With 100,000 pending rows, the claim (rolled back each time, so every
measurement sees the same table) and the backlog query are timed beside 10,000 sent rows,
then again once 1,000,000 sent rows are there. Sent rows arrive at the same steady rate in
both cases (the bigger table has kept them longer), so the backlog's sliding-window count
of recent sends is the same size, as in production.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.accounting import percentile
from bench.pgserver import BenchServer
from bench.sqlfiles import bench_query
from leasebox.db.queries import query
from leasebox.producer.payload_crypto import default_cipher
from leasebox.store.backlog import fetch_backlog

SENT_PER_SECOND = 10.0
CHUNK = 100_000
CLAIM_BATCH = 32


@dataclass(frozen=True)
class ScaleResult:
    sent_rows: int
    pending_rows: int
    claim_ms_median: float
    claim_ms_p95: float
    backlog_ms_median: float
    backlog_ms_p95: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent_rows": self.sent_rows,
            "pending_rows": self.pending_rows,
            "claim_ms_median": round(self.claim_ms_median, 3),
            "claim_ms_p95": round(self.claim_ms_p95, 3),
            "backlog_ms_median": round(self.backlog_ms_median, 3),
            "backlog_ms_p95": round(self.backlog_ms_p95, 3),
        }


def _add_sent(conn: psycopg.Connection[Any], have: int, want: int) -> None:
    """Grow the sent rows from `have` to `want`, older ones further back in time."""
    for first in range(have, want, CHUNK):
        count = min(CHUNK, want - first)
        conn.execute(
            bench_query("seed_sent"),
            {
                "first": first,
                "count": count,
                "offset": first / SENT_PER_SECOND,
                "span": count / SENT_PER_SECOND,
            },
        )


def _timings(action: Callable[[], None], repeats: int) -> list[float]:
    for _ in range(3):
        action()
    found = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        found.append((time.perf_counter() - start) * 1000)
    return found


def _measure(dsn: str, sent: int, pending: int, repeats: int) -> ScaleResult:
    params = {
        "kinds": ["otp"],
        "now": None,
        "limit": CLAIM_BATCH,
        "lease_seconds": 45.0,
        "worker_id": "bench",
    }
    with psycopg.connect(dsn) as conn:

        def claim() -> None:
            rows = conn.execute(query("claim"), params).fetchall()
            assert len(rows) == CLAIM_BATCH
            conn.rollback()

        def backlog() -> None:
            fetch_backlog(conn, ["otp"])
            conn.rollback()

        claims = _timings(claim, repeats)
        backlogs = _timings(backlog, repeats)
    return ScaleResult(
        sent,
        pending,
        percentile(claims, 0.5),
        percentile(claims, 0.95),
        percentile(backlogs, 0.5),
        percentile(backlogs, 0.95),
    )


def run_scale(
    server: BenchServer, pending: int, sent_sizes: tuple[int, ...], repeats: int
) -> list[ScaleResult]:
    results = []
    with server.database("scale", leasebox_schema=True) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            secrets = default_cipher().seal({"code": "246810"})
            for first in range(0, pending, CHUNK):
                conn.execute(
                    bench_query("seed_ready"),
                    {"first": first, "count": min(CHUNK, pending - first), "secrets": secrets},
                )
        have = 0
        for size in sent_sizes:
            with psycopg.connect(dsn, autocommit=True) as conn:
                _add_sent(conn, have, size)
                conn.execute("VACUUM (ANALYZE)")
                conn.execute("CHECKPOINT")
            have = size
            results.append(_measure(dsn, size, pending, repeats))
    return results
