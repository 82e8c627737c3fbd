"""`python -m bench.run`: every benchmark in one run on one PostgreSQL server, then a report.

Peers run in the same run as leasebox because only ratios survive the noise of a small
shared machine. `--quick` runs everything small as a smoke check; `--only` picks
benchmarks. A full run (all four benchmarks, default sizes) also refreshes the figures in
`bench/README.md`.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import node_peers, report, targets
from bench.drain import DrainResult, run_drain
from bench.enqueue_rate import run_enqueue
from bench.latency import run_latency
from bench.pgserver import bench_server
from bench.systems import FACTORIES, NODE_SYSTEMS, leasebox_worker_ready
from bench.table_scale import run_scale

BENCHMARKS = ("drain", "enqueue", "latency", "scale")
DEFAULT_JSON = Path("bench/results/latest.json")
PYTHON_PEERS = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate"}


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs."""

    drain_rows: tuple[int, ...] = (20_000, 100_000)
    drain_processes: tuple[int, ...] = (1, 2)
    drain_best_of: tuple[tuple[int, int], ...] = ((20_000, 2),)
    enqueue_single: int = 5_000
    enqueue_batched: int = 20_000
    latency_rate: float = 500.0
    latency_seconds: float = 15.0
    scale_pending: int = 100_000
    scale_sent: tuple[int, ...] = (10_000, 1_000_000)
    scale_repeats: int = 200


QUICK = Sizes(
    drain_rows=(2_000,),
    drain_processes=(1, 2),
    enqueue_single=500,
    enqueue_batched=2_000,
    latency_seconds=3.0,
    scale_pending=10_000,
    scale_sent=(1_000, 20_000),
    scale_repeats=30,
)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke check")
    parser.add_argument(
        "--only", action="append", choices=BENCHMARKS, help="run only this benchmark (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    parser.add_argument(
        "--server-dsn",
        help="use this PostgreSQL server instead of an embedded "
        "one (databases are created and dropped on it)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(FACTORIES),
        help=f"drain systems, comma-separated (default: {','.join(FACTORIES)})",
    )
    parser.add_argument("--rows", type=_ints, help="drain row counts, e.g. 20000,100000")
    parser.add_argument("--processes", type=_ints, help="drain process counts, e.g. 1,2")
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
    if NODE_SYSTEMS & set(names) and "drain" in chosen:
        skipped_node = node_peers.ensure_installed()
        if skipped_node:
            print(f"skipping the Node.js peers: {skipped_node}", file=sys.stderr)
            names = [n for n in names if n not in NODE_SYSTEMS]
    needs_worker = "latency" in chosen or ("drain" in chosen and "leasebox" in names)
    if needs_worker and not leasebox_worker_ready():
        raise SystemExit("`leasebox worker --help` fails: the worker command is not available")
    rows = args.rows or sizes.drain_rows
    processes = args.processes or sizes.drain_processes
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "benchmarks": list(chosen),
        "machine": report.machine(),
        "load_before": report.load_average(),
        "versions": _versions(skipped_node),
    }
    began = time.perf_counter()
    with bench_server(args.server_dsn) as server:
        results["postgres"] = server.describe()
        if "drain" in chosen:
            systems = [FACTORIES[n]() for n in names]
            results["drain_settings"] = {
                s.name: {"version": s.version, "settings": s.settings, "notes": s.notes}
                for s in systems
            }
            plan = [(r, p) for r in rows for p in processes]
            drained = run_drain(
                server, systems, plan, best_of=dict(sizes.drain_best_of), progress=_progress
            )
            results["drain"] = [d.as_dict() for d in drained]
        if "enqueue" in chosen:
            print("  enqueue ...", flush=True)
            results["enqueue"] = [
                r.as_dict()
                for r in run_enqueue(server, sizes.enqueue_single, sizes.enqueue_batched)
            ]
        if "latency" in chosen:
            print("  latency ...", flush=True)
            results["latency"] = [
                r.as_dict() for r in run_latency(server, sizes.latency_rate, sizes.latency_seconds)
            ]
        if "scale" in chosen:
            print("  scale of the table ...", flush=True)
            results["scale"] = [
                r.as_dict()
                for r in run_scale(
                    server, sizes.scale_pending, sizes.scale_sent, sizes.scale_repeats
                )
            ]
    results["duration_seconds"] = round(time.perf_counter() - began, 1)
    results["load_after"] = report.load_average()
    found: list[targets.Target] = []
    if results.get("drain") and len(rows) >= 2:
        found += targets.drain_targets(results["drain"], min(rows), max(rows))
    elif results.get("drain"):
        found += targets.drain_targets(results["drain"], rows[0], rows[0])[:2]
    found += targets.enqueue_targets(results.get("enqueue", []))
    found += targets.latency_targets(results.get("latency", []))
    found += targets.scale_targets(results.get("scale", []))
    results["targets"] = [t.as_dict() for t in found]
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    report.write_json(results, args.json)
    print()
    print(report.render(results))
    print(f"\nresults: {args.json}")
    full = not args.quick and not args.only and not args.rows and not args.processes
    if full and not args.no_readme and not args.server_dsn and report.update_readme(results):
        print(f"figures refreshed in {report.README}")
    failed = [d for d in results.get("drain", []) if not d["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
