"""`python -m bench.run`: every benchmark in one run on one PostgreSQL server, then a report.

Peers and yardsticks run in the same run as leasebox because only ratios survive the noise
of a small shared machine. `--quick` (or `BENCH_QUICK=1`) runs everything small, in a few
minutes, to check the harness; `--only` picks benchmarks. A full run (every benchmark,
default sizes) also refreshes the figures in `bench/README.md`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import enqueue_peers, node_peers, report, targets
from bench.drain import DrainResult, run_drain
from bench.enqueue_rate import run_enqueue
from bench.history import run_history
from bench.latency import run_latency
from bench.otp_semantics import run_backlog_latency, run_quota
from bench.pgserver import bench_server
from bench.profile_drain import run_profile
from bench.providers import SMTP_POOL_SIZE, run_http, run_smtp
from bench.standins import SmtpServer
from bench.systems import FACTORIES, LEASEBOX_BATCH_FLAGS, NODE_SYSTEMS, leasebox_worker_ready

BENCHMARKS = (
    "drain",
    "backlog",
    "history",
    "enqueue",
    "providers",
    "latency",
    "otp-backlog",
    "quota",
    "profile",
)
DEFAULT_JSON = Path("bench/results/latest.json")
PYTHON_PEERS = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate"}
BACKLOG_SYSTEMS = ("leasebox", "minimal")


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs."""

    drain_rows: tuple[int, ...] = (20_000, 100_000)
    drain_processes: tuple[int, ...] = (1, 2)
    drain_best_of: tuple[tuple[int, int], ...] = ((20_000, 2),)
    backlog_rows: int = 1_000_000
    history_rows: int = 10_000_000
    history_ready: int = 20_000
    history_repeats: int = 200
    enqueue_single: int = 5_000
    enqueue_batched: int = 20_000
    enqueue_rounds: int = 2
    http_rows: int = 10_000
    http_concurrency: int = 64
    smtp_rows: int = 10_000
    latency_rate: float = 500.0
    latency_seconds: float = 15.0
    otp_backlog: int = 100_000
    otp_rate: float = 50.0
    otp_seconds: float = 4.0
    quota_workers: tuple[int, ...] = (1, 4, 16)
    quota_rate: float = 50.0
    quota_seconds: float = 20.0
    profile_rows: int = 100_000
    profile_smtp_rows: int = 5_000


QUICK = Sizes(
    drain_rows=(2_000, 5_000),
    drain_best_of=(),
    backlog_rows=20_000,
    history_rows=200_000,
    history_ready=2_000,
    history_repeats=40,
    enqueue_single=500,
    enqueue_batched=2_000,
    enqueue_rounds=1,
    http_rows=1_000,
    smtp_rows=1_000,
    latency_seconds=3.0,
    otp_backlog=10_000,
    otp_rate=100.0,
    otp_seconds=1.0,
    quota_rate=25.0,
    quota_seconds=3.0,
    profile_rows=5_000,
    profile_smtp_rows=500,
)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _quick_from_environment() -> bool:
    return os.environ.get("BENCH_QUICK", "").strip().lower() in {"1", "true", "yes", "on"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        default=_quick_from_environment(),
        help="small sizes, a check of the harness (also BENCH_QUICK=1)",
    )
    parser.add_argument(
        "--only", action="append", choices=BENCHMARKS, help="run only this benchmark (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    parser.add_argument(
        "--server-dsn",
        help="use this PostgreSQL server instead of an embedded one (databases are created "
        "and dropped on it); a Unix socket works: postgresql://user@/db?host=/var/run/postgresql",
    )
    parser.add_argument(
        "--systems",
        default=",".join(FACTORIES),
        help=f"drain systems, comma-separated (default: {','.join(FACTORIES)})",
    )
    parser.add_argument("--rows", type=_ints, help="drain row counts, e.g. 20000,100000")
    parser.add_argument("--processes", type=_ints, help="drain process counts, e.g. 1,2")
    parser.add_argument("--backlog-rows", type=int, help="the backlog drain's rows (1,000,000)")
    parser.add_argument(
        "--history-rows", type=int, help="sent rows retained by the history benchmark (10,000,000)"
    )
    parser.add_argument(
        "--no-readme", action="store_true", help="do not refresh bench/README.md after a full run"
    )
    return parser.parse_args(argv)


def _versions(skipped_node: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in ("leasebox", "psycopg", "pgqueuer", "asyncpg", "uvloop", "procrastinate"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    for package in node_peers.PACKAGES:
        found[package] = node_peers.installed_version(package) or f"skipped ({skipped_node})"
    found["node"] = node_peers.node_version() or "not installed"
    return found


def _progress(result: DrainResult) -> None:
    status = "ok" if result.ok else f"FAILED {result.error or result.accounting}"
    print(
        f"  drain {result.system:16} {result.rows:>7,} rows x {result.processes}p: "
        f"{result.rate:>9,.0f}/s (wall {result.wall_seconds:.2f} s, start-up "
        f"{result.idle_seconds:.2f} s) {status}",
        flush=True,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else Sizes()
    chosen = tuple(args.only or BENCHMARKS)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in FACTORIES]
    if unknown:
        raise SystemExit(f"unknown systems: {', '.join(unknown)} (know {', '.join(FACTORIES)})")
    for name, module in PYTHON_PEERS.items():
        if name in names and importlib.util.find_spec(module) is None:
            print(
                f"skipping {name}: install the bench extra (pip install -e '.[bench]')",
                file=sys.stderr,
            )
            names.remove(name)
    skipped_node = None
    producers: tuple[str, ...] = ()
    if "enqueue" in chosen:
        producers, skipped = enqueue_peers.available()
        for peer, why in skipped.items():
            print(f"skipping {peer} in the enqueue benchmark: {why}", file=sys.stderr)
        skipped_node = skipped.get("pgboss")
    if NODE_SYSTEMS & set(names) and "drain" in chosen:
        skipped_node = node_peers.ensure_installed()
        if skipped_node:
            print(f"skipping the Node.js peers: {skipped_node}", file=sys.stderr)
            names = [n for n in names if n not in NODE_SYSTEMS]
    if not leasebox_worker_ready():
        raise SystemExit("`leasebox worker --help` fails: the worker command is not available")
    rows = args.rows or sizes.drain_rows
    processes = args.processes or sizes.drain_processes
    backlog = args.backlog_rows or sizes.backlog_rows
    history_rows = args.history_rows if args.history_rows is not None else sizes.history_rows
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "benchmarks": list(chosen),
        "machine": report.machine(),
        "load_before": report.load_average(),
        "versions": _versions(skipped_node),
        "drain_sizes": list(rows),
    }
    began = time.perf_counter()
    with bench_server(args.server_dsn) as server:
        results["postgres"] = server.describe()
        drained: list[DrainResult] = []
        if "drain" in chosen:
            systems = [FACTORIES[n]() for n in names]
            results["drain_settings"] = {
                s.name: {"version": s.version, "settings": s.settings, "notes": s.notes}
                for s in systems
            }
            plan = [(r, p) for r in rows for p in processes]
            drained += run_drain(
                server, systems, plan, best_of=dict(sizes.drain_best_of), progress=_progress
            )
        if "backlog" in chosen:
            print(f"  backlog of {backlog:,} rows ...", flush=True)
            systems = [FACTORIES[n]() for n in BACKLOG_SYSTEMS]
            drained += run_drain(server, systems, [(backlog, 1)], progress=_progress)
            results["backlog_rows"] = backlog
        if drained:
            results["drain"] = [d.as_dict() for d in drained]
        if "history" in chosen:
            results["history"] = run_history(
                server, history_rows, sizes.history_ready, sizes.history_repeats
            ).as_dict()
        if "enqueue" in chosen:
            print("  enqueue ...", flush=True)
            results["enqueue"] = [
                r.as_dict()
                for r in run_enqueue(
                    server,
                    sizes.enqueue_single,
                    sizes.enqueue_batched,
                    producers,
                    sizes.enqueue_rounds,
                )
            ]
        if "providers" in chosen:
            print("  providers: HTTP stand-in ...", flush=True)
            http = run_http(server, sizes.http_rows, sizes.http_concurrency)
            print("  providers: SMTP server ...", flush=True)
            results["providers"] = {"http": http, "smtp": run_smtp(server, sizes.smtp_rows)}
        if "latency" in chosen:
            print("  latency ...", flush=True)
            results["latency"] = [
                r.as_dict() for r in run_latency(server, sizes.latency_rate, sizes.latency_seconds)
            ]
        if "otp-backlog" in chosen:
            print(f"  OTP latency behind {sizes.otp_backlog:,} verifications ...", flush=True)
            results["otp_backlog"] = [
                r.as_dict()
                for r in run_backlog_latency(
                    server, sizes.otp_backlog, sizes.otp_rate, sizes.otp_seconds
                )
            ]
        if "quota" in chosen:
            print(f"  quota accuracy with {sizes.quota_workers} workers ...", flush=True)
            results["quota"] = [
                r.as_dict()
                for r in run_quota(
                    server, sizes.quota_workers, sizes.quota_rate, sizes.quota_seconds
                )
            ]
        if "profile" in chosen:
            print(f"  profile of a {sizes.profile_rows:,}-row drain (null://) ...", flush=True)
            profiles = [run_profile(server, sizes.profile_rows)]
            print(f"  profile of a {sizes.profile_smtp_rows:,}-row drain (smtp://) ...", flush=True)
            with SmtpServer() as smtp:
                profiles.append(
                    run_profile(
                        server,
                        sizes.profile_smtp_rows,
                        name="smtp",
                        provider=smtp.url(SMTP_POOL_SIZE),
                        flags=LEASEBOX_BATCH_FLAGS,
                    )
                )
            results["profiles"] = [p.as_dict() for p in profiles]
    results["duration_seconds"] = round(time.perf_counter() - began, 1)
    results["load_after"] = report.load_average()
    results["targets"] = [t.as_dict() for t in targets.all_targets(results)]
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    report.write_json(results, args.json)
    print()
    print(report.render(results))
    print(f"\nresults: {args.json}")
    full = not (args.quick or args.only or args.rows or args.processes)
    full = full and args.backlog_rows is None and args.history_rows is None
    if full and not args.no_readme and not args.server_dsn and report.update_readme(results):
        print(f"figures refreshed in {report.README}")
    problems = failures(results)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


def failures(results: dict[str, Any]) -> list[str]:
    """Runs whose figures mean nothing: failed or not exactly-once (a missed target is not
    one of them, nor a missing product feature)."""
    found = [
        f"drain {d['system']} {d['rows']:,} x {d['processes']}p: {d['error'] or 'not exactly-once'}"
        for d in results.get("drain", [])
        if not d["ok"]
    ]
    found += [f"history: {e}" for e in (results.get("history") or {}).get("errors", [])]
    for name, case in (results.get("providers") or {}).items():
        for side in ("bare", "worker"):
            run = case.get(side)
            if run is not None and not run["ok"]:
                found.append(f"provider {name} {side}: {run['error'] or 'not exactly-once'}")
    found += [
        f"enqueue {r['method']} {r['mode']}: {r['error']}"
        for r in results.get("enqueue", [])
        if r.get("error") and not str(r["error"]).startswith("missing")
    ]
    found += [f"latency: {r['error']}" for r in results.get("latency", []) if r.get("error")]
    found += [
        f"otp-backlog: {r['error']}" for r in results.get("otp_backlog", []) if r.get("error")
    ]
    found += [
        f"quota {r['workers']} workers: {r['error']}"
        for r in results.get("quota", [])
        if r.get("error")
    ]
    return found


if __name__ == "__main__":
    sys.exit(main())
