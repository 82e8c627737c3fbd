"""The latency benchmark: enqueue-to-sent time at a steady arrival rate.

A real `leasebox worker` process (null provider) serves a producer that enqueues at a fixed
rate, one transaction per message, from a few connections at once (as concurrent requests
would), for a fixed time; the latency of each message is
`sent_at - created_at` from the table, so the clock is the database's for both ends. It runs
with LISTEN/NOTIFY on (the worker wakes on insert) and off (`--no-listen`: it polls).
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.pgserver import BenchServer
from bench.sqlfiles import bench_query
from bench.systems import ROOT, leasebox_command
from leasebox.messages import OutboxMessage
from leasebox.producer.enqueue import enqueue

SETTLE_SECONDS = 30.0
PRODUCER_LANES = 4


@dataclass(frozen=True)
class LatencyResult:
    listen: bool
    rate: float
    seconds: float
    enqueued: int
    sent: int
    achieved_rate: float
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        def ms(value: float | None) -> float | None:
            return None if value is None else round(value, 2)

        return {
            "listen_notify": self.listen,
            "target_rate": self.rate,
            "seconds": self.seconds,
            "enqueued": self.enqueued,
            "sent": self.sent,
            "achieved_rate": round(self.achieved_rate, 1),
            "p50_ms": ms(self.p50_ms),
            "p99_ms": ms(self.p99_ms),
            "max_ms": ms(self.max_ms),
            "error": self.error,
        }


def _wait_for_worker(dsn: str, timeout: float = 20.0) -> bool:
    """True once the worker holds a connection (it is past start-up)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            if row and row[0] > 0:
                return True
            time.sleep(0.05)
    return False


def _produce_share(
    dsn: str, rate: float, seconds: float, lane: int, lanes: int, start: float
) -> int:
    """Enqueue messages lane, lane + lanes, ... on their schedule; return how many."""
    interval = 1.0 / rate
    count = 0
    with psycopg.connect(dsn) as conn:
        for i in range(lane, int(rate * seconds), lanes):
            pause = start + i * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            message = OutboxMessage(
                kind="otp",
                recipient=f"user{i}@example.com",
                aggregate_id=f"user-{i}",
                data={"name": f"User {i}", "minutes_valid": 10},
                secrets={"code": f"{i % 1000000:06d}"},
            )
            with conn.transaction():
                enqueue(conn, message, idempotency_key=f"latency-{i}", scope="bench")
            count += 1
    return count


def _produce(dsn: str, rate: float, seconds: float) -> tuple[int, float]:
    """Enqueue at `rate` per second for `seconds` from PRODUCER_LANES connections, as
    concurrent API requests would; (messages, seconds it took)."""
    start = time.perf_counter() + 0.2
    with ThreadPoolExecutor(PRODUCER_LANES) as pool:
        futures = [
            pool.submit(_produce_share, dsn, rate, seconds, lane, PRODUCER_LANES, start)
            for lane in range(PRODUCER_LANES)
        ]
        count = sum(f.result() for f in futures)
    return count, time.perf_counter() - start


def run_latency_case(
    server: BenchServer, *, listen: bool, rate: float, seconds: float, warmup: float = 1.0
) -> LatencyResult:
    with server.database("latency", leasebox_schema=True) as dsn:
        command = [
            *leasebox_command(),
            "worker",
            "--provider",
            "null://",
            "--kinds",
            "otp",
            "--dsn",
            dsn,
            "--metrics-port",
            "0",
            "--log-level",
            "warning",
        ]
        if not listen:
            command.append("--no-listen")
        log = Path(ROOT / "build" / f"bench-latency-{'listen' if listen else 'poll'}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            worker = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            if not _wait_for_worker(dsn):
                return LatencyResult(
                    listen,
                    rate,
                    seconds,
                    0,
                    0,
                    0,
                    None,
                    None,
                    None,
                    "the worker did not connect within 20 s",
                )
            time.sleep(warmup)
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT now()").fetchone()
            assert row is not None
            since: datetime = row[0]
            enqueued, took = _produce(dsn, rate, seconds)
            deadline = time.monotonic() + SETTLE_SECONDS
            with psycopg.connect(dsn, autocommit=True) as conn:
                while time.monotonic() < deadline:
                    left = conn.execute(bench_query("unfinished_since"), {"since": since})
                    found = left.fetchone()
                    if found is not None and found[0] == 0:
                        break
                    time.sleep(0.1)
                stats = conn.execute(bench_query("latency_stats"), {"since": since}).fetchone()
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    assert stats is not None
    sent, total, p50, p99, most = stats
    error = "" if sent == total == enqueued else f"{sent} of {enqueued} sent within the wait"
    return LatencyResult(
        listen,
        rate,
        seconds,
        enqueued,
        int(sent),
        enqueued / took,
        _float(p50),
        _float(p99),
        _float(most),
        error,
    )


def _float(value: object) -> float | None:
    return None if value is None else float(str(value))


def run_latency(server: BenchServer, rate: float, seconds: float) -> list[LatencyResult]:
    return [
        run_latency_case(server, listen=listen, rate=rate, seconds=seconds)
        for listen in (True, False)
    ]
