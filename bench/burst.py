"""The burst benchmark: a login storm into a queue whose statistics know nothing of it.

After a quiet night the queue has not been analysed since it was nearly empty: autovacuum
analyses a table only once enough of it changed, and then at its next naptime. A burst of N
messages (`enqueue_many`, 1,000 a transaction) into a freshly migrated, never-analysed
schema is drained by one worker (`leasebox worker --drain`, `null://`), and the rate over
its first seconds (8 by default) is compared with the same drain after an ANALYZE (fresh
statistics), in the same run on the same server. Autovacuum keeps the server's stock
settings (and the queue's own, from the schema), as it would in production; whether it
analysed the queue before the drain started is recorded, since that would void the case.

The rate is read from the history, in the database's own times: the messages sent within
the window after the first claim, over the window (or over the whole drain when it is
shorter), so the worker's start-up is left out. Every run is checked for exactly-once
processing. A drain of 100,000 rows takes a few seconds, so one drain each would judge the
noise of a shared machine (a ratio of 0.78 and 1.10 in two runs of one tree): the two cases
alternate for a few rounds (3 by default) and the medians of their valid rounds are
compared. `python -m bench.burst [--rows N] [--rounds N] [--quick]`; the JSON goes to
`bench/results/burst.json`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.drain import run_workers
from bench.pgserver import BenchServer, bench_server
from bench.report import load_average, machine, write_json
from bench.sqlfiles import bench_query
from bench.systems import leasebox_system
from bench.targets import judged
from leasebox import OutboxMessage, enqueue_many

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "burst.json"
ROWS, QUICK_ROWS = 100_000, 20_000
WINDOW_SECONDS = 8.0
ROUNDS = 3
BATCH = 1_000
GOAL = 0.9
NEVER_ANALYSED, FRESH = "never analysed", "fresh statistics"
SETTINGS = ("server_version", "autovacuum", "autovacuum_naptime", "autovacuum_analyze_threshold")


@dataclass(frozen=True)
class BurstRun:
    """One drain of a burst: how fast its first seconds went, and its accounting."""

    case: str
    rows: int
    window_seconds: float
    sent_in_window: int
    drain_seconds: float
    analysed_before_drain: bool
    exactly_once: bool
    error: str = ""
    round: int = 1

    @property
    def judged(self) -> bool:
        """Whether the run counts: a clean drain, and a never-analysed queue still so."""
        return self.rate is not None and not (
            self.case == NEVER_ANALYSED and self.analysed_before_drain
        )

    @property
    def rate(self) -> float | None:
        """Messages per second over the window, or over the whole drain when shorter."""
        seconds = min(self.window_seconds, self.drain_seconds)
        if self.error or not self.exactly_once or seconds <= 0:
            return None
        return self.sent_in_window / seconds

    def as_dict(self) -> dict[str, Any]:
        rate = self.rate
        return {
            "case": self.case,
            "round": self.round,
            "rows": self.rows,
            "window_seconds": self.window_seconds,
            "sent_in_window": self.sent_in_window,
            "drain_seconds": round(self.drain_seconds, 3),
            "rate_per_second": None if rate is None else round(rate, 1),
            "whole_drain_per_second": round(self.rows / self.drain_seconds, 1)
            if self.drain_seconds > 0
            else None,
            "analysed_before_drain": self.analysed_before_drain,
            "exactly_once": self.exactly_once,
            "error": self.error,
        }


def enqueue_burst(dsn: str, rows: int) -> None:
    """`rows` OTP messages, `BATCH` to a transaction, as an application writes a storm."""
    with psycopg.connect(dsn) as conn:
        for start in range(0, rows, BATCH):
            messages = [
                OutboxMessage(
                    kind="otp", recipient=f"user{i}@example.com", data={"code": f"{i:06}"}
                )
                for i in range(start, min(start + BATCH, rows))
            ]
            with conn.transaction():
                enqueue_many(conn, messages)


def queue_analysed(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(bench_query("queue_statistics"), {"queue": "leasebox.queue"}).fetchone()
    return bool(row and row[1])


def drain_burst(
    server: BenchServer, case: str, rows: int, window: float, round_: int = 1
) -> BurstRun:
    """A fresh database, the burst, an ANALYZE for `FRESH`, then one worker drains it."""
    system = leasebox_system()
    with (
        server.database("burst", leasebox_schema=True) as dsn,
        tempfile.TemporaryDirectory(prefix="leasebox-burst-") as tmp,
    ):
        enqueue_burst(dsn, rows)
        with psycopg.connect(dsn, autocommit=True) as conn:
            if case == FRESH:
                conn.execute("ANALYZE")
            conn.execute("CHECKPOINT")
        analysed = queue_analysed(dsn)
        run = run_workers(system, dsn, 1, Path(tmp), "burst", timeout=600)
        accounting = system.verify(dsn, rows, run.id_files)
        with psycopg.connect(dsn) as conn:
            found = conn.execute(bench_query("burst_window"), {"window_seconds": window}).fetchone()
        drain_seconds, sent = (found[0] or 0.0, int(found[1])) if found else (0.0, 0)
        return BurstRun(
            case,
            rows,
            window,
            sent,
            drain_seconds,
            analysed,
            accounting.exactly_once,
            run.error,
            round_,
        )


def median_rate(runs: Sequence[BurstRun], case: str) -> float | None:
    """The median rate of the judged rounds of `case`; None when none counts."""
    rates = [r for run in runs if run.case == case and run.judged and (r := run.rate)]
    return statistics.median(rates) if rates else None


def evaluate(runs: Sequence[BurstRun]) -> dict[str, Any]:
    """The target: the never-analysed burst's first seconds at 0.9x the fresh statistics',
    as the medians of their rounds (a void or broken round is left out)."""
    stale, fresh = median_rate(runs, NEVER_ANALYSED), median_rate(runs, FRESH)
    value = stale / fresh if stale is not None and fresh else None
    window = runs[0].window_seconds if runs else WINDOW_SECONDS
    counted = sum(run.judged for run in runs if run.case == NEVER_ANALYSED)
    measured = (
        f"{_rate(stale)}/s vs {_rate(fresh)}/s over the first {window:g} s, medians of "
        f"{counted} and {sum(run.judged for run in runs if run.case == FRESH)} rounds"
    )
    goal = f"a burst into a never-analysed queue drains at >= {GOAL}x fresh statistics"
    return judged("burst", goal, value, measured, at_least=GOAL).as_dict()


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f}"


def render(results: dict[str, Any]) -> str:
    lines = [
        "**Burst** (one worker, `null://`; rate over the first seconds after the first claim)",
        "",
        "| statistics | round | rows | first seconds (msg/s) | whole drain (msg/s) "
        "| exactly once |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in results["runs"]:
        first, whole = run["rate_per_second"], run["whole_drain_per_second"]
        stale = run["case"] == NEVER_ANALYSED and run["analysed_before_drain"]
        note = " (analysed by autovacuum before the drain: void)" if stale else ""
        lines.append(
            f"| {run['case']}{note} | {run.get('round', 1)} | {run['rows']:,} | "
            f"{'n/a' if first is None else f'{first:,.0f}'} | "
            f"{'n/a' if whole is None else f'{whole:,.0f}'} | {run['exactly_once']} |"
        )
    target = results["target"]
    ratio = "n/a" if target["ratio"] is None else f"{target['ratio']:.2f}"
    lines += ["", f"Target: {target['goal']}: {target['measured']}, {ratio}, {target['status']}"]
    return "\n".join(lines)


def describe(server: BenchServer) -> dict[str, str]:
    with psycopg.connect(server.server_dsn) as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(SETTINGS),)
        ).fetchall()
    return {str(name): str(setting) for name, setting in rows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = args.rows or (QUICK_ROWS if args.quick else ROWS)
    started = time.time()
    load_before = load_average()
    with bench_server(args.server_dsn) as server:
        postgres = describe(server)
        runs = [
            drain_burst(server, case, rows, args.window, round_)
            for round_ in range(1, args.rounds + 1)
            for case in (NEVER_ANALYSED, FRESH)
        ]
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_seconds": round(time.time() - started, 1),
        "machine": machine(),
        "load_before": load_before,
        "load_after": load_average(),
        "postgres": postgres,
        "runs": [r.as_dict() for r in runs],
        "target": evaluate(runs),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__)
    parser.add_argument("--rows", type=int, help=f"messages in the burst ({ROWS:,})")
    parser.add_argument(
        "--quick",
        action="store_true",
        default=bool(os.environ.get("BENCH_QUICK")),
        help=f"a small burst ({QUICK_ROWS:,}): checks the harness, not the figure",
    )
    parser.add_argument("--window", type=float, default=WINDOW_SECONDS, help="seconds judged")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"drains of each case, alternating; medians are judged ({ROUNDS}, 1 with --quick)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    parser.add_argument("--server-dsn", help="an existing server instead of the embedded one")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else ROUNDS
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    results = run(args)
    write_json(results, args.json)
    print(render(results))
    return 0 if all(r["exactly_once"] and not r["error"] for r in results["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
