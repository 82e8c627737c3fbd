"""The drain benchmark: how fast each system empties a queue of N ready no-op jobs.

For each system, row count and process count: a fresh database, the system's schema, an
*empty-queue* run of the same worker command (start-up, connecting, schema checks and
exit), then N seeded jobs, VACUUM ANALYZE and a CHECKPOINT, and the timed run from spawning
the processes until the last one exits. The rate is N over the timed run less the
empty-queue run, so the figures compare draining rather than interpreter start-up; both
raw timings are kept in the JSON. Every run is then checked for exactly-once processing.

Each worker process is reaped with `wait4`, which hands back that process's own CPU time
(user + system, its children included), so the CPU a system spends per message is the
timed run's CPU less the empty-queue run's, over N: measured, not estimated.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg

from bench.accounting import Accounting, net_rate, per_message_micros
from bench.pgserver import BenchServer
from bench.systems import ROOT, DrainSystem

DEFAULT_TIMEOUT_SECONDS = 900.0
IDLE_RUNS = 2


@dataclass(frozen=True)
class WorkerRun:
    """What a set of worker processes did: how long, how much CPU, and any error."""

    seconds: float
    cpu_seconds: float
    id_files: list[Path]
    error: str = ""


@dataclass(frozen=True)
class Idle:
    """The cost of a worker command on an empty queue: start-up, connecting and exit."""

    seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class DrainResult:
    system: str
    rows: int
    processes: int
    wall_seconds: float
    idle_seconds: float
    rate: float
    gross_rate: float
    accounting: Accounting | None
    error: str = ""
    attempt_rates: tuple[float, ...] = ()
    cpu_seconds: float = 0.0
    idle_cpu_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and self.accounting is not None and self.accounting.exactly_once

    @property
    def cpu_us_per_message(self) -> float | None:
        """Worker CPU per message, start-up taken out (µs); None without a good run."""
        if not self.ok:
            return None
        return per_message_micros(self.cpu_seconds, self.idle_cpu_seconds, self.rows)

    def as_dict(self) -> dict[str, Any]:
        cpu = self.cpu_us_per_message
        return {
            "system": self.system,
            "rows": self.rows,
            "processes": self.processes,
            "wall_seconds": round(self.wall_seconds, 3),
            "idle_seconds": round(self.idle_seconds, 3),
            "rate_per_second": round(self.rate, 1),
            "gross_rate_per_second": round(self.gross_rate, 1),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "idle_cpu_seconds": round(self.idle_cpu_seconds, 3),
            "cpu_us_per_message": None if cpu is None else round(cpu, 2),
            "accounting": self.accounting.as_dict() if self.accounting else None,
            "ok": self.ok,
            "error": self.error,
            "rates_of_all_rounds": [round(r, 1) for r in self.attempt_rates or (self.rate,)],
        }


def failed(system: str, rows: int, processes: int, error: str) -> DrainResult:
    return DrainResult(system, rows, processes, 0, 0, 0, 0, None, error[:300])


def run_processes(
    commands: list[list[str]], logs: list[Path], timeout: float, env: dict[str, str] | None = None
) -> tuple[float, float, str]:
    """Start every command at once and reap each with `wait4`: (seconds until the last one
    exited, their CPU seconds together, an error or "")."""
    running: list[subprocess.Popen[bytes]] = []
    ended: dict[int, tuple[int, float, float]] = {}
    start = time.perf_counter()
    for command, log_path in zip(commands, logs, strict=True):
        with log_path.open("wb") as log:
            running.append(
                subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            )

    def reap(proc: subprocess.Popen[bytes]) -> None:
        _, status, usage = os.wait4(proc.pid, 0)
        ended[proc.pid] = (status, usage.ru_utime + usage.ru_stime, time.perf_counter())

    reapers = [threading.Thread(target=reap, args=(p,), daemon=True) for p in running]
    for reaper in reapers:
        reaper.start()
    error = ""
    deadline = start + timeout
    for reaper in reapers:
        reaper.join(max(deadline - time.perf_counter(), 0.1))
    for proc, reaper in zip(running, reapers, strict=True):
        if reaper.is_alive():
            error = error or f"timed out after {timeout:.0f} s"
            os.kill(proc.pid, 9)
            reaper.join()
    finished = time.perf_counter()
    cpu = 0.0
    for k, proc in enumerate(running):
        status, seconds, _ = ended[proc.pid]
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu += seconds
        if proc.returncode != 0 and not error:
            tail = logs[k].read_text(errors="replace").strip().splitlines()[-3:]
            error = f"worker exited {proc.returncode}: {' | '.join(tail)}"
    last = max((t for _, _, t in ended.values()), default=finished)
    return last - start, cpu, error


def run_workers(
    system: DrainSystem, dsn: str, processes: int, workdir: Path, tag: str, timeout: float
) -> WorkerRun:
    """`processes` workers of `system` started at once, each reaped with its CPU time."""
    ids = [workdir / f"{tag}-ids-{k}.json" for k in range(processes)]
    logs = [workdir / f"{tag}-log-{k}.txt" for k in range(processes)]
    commands = [system.worker_command(dsn, ids[k]) for k in range(processes)]
    seconds, cpu, error = run_processes(commands, logs, timeout)
    return WorkerRun(seconds, cpu, ids, error)


def settle(dsn: str) -> None:
    """Give every system the same start: fresh statistics, no dirty pages pending."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")


def measure_idle(system: DrainSystem, dsn: str, processes: int, workdir: Path) -> Idle | str:
    """The faster of two empty-queue runs (the first pays for cold caches); or the error."""
    runs = []
    for attempt in range(IDLE_RUNS):
        run = run_workers(system, dsn, processes, workdir, f"idle{attempt}", 120)
        if run.error:
            return f"empty-queue run: {run.error}"
        runs.append(run)
    return Idle(min(r.seconds for r in runs), min(r.cpu_seconds for r in runs))


def timed_drain(
    system: DrainSystem,
    dsn: str,
    rows: int,
    processes: int,
    workdir: Path,
    idle: Idle,
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    verify: Callable[[str, int, list[Path]], Accounting] | None = None,
) -> DrainResult:
    """Drain the `rows` already seeded in `dsn`, then check them (with `verify`, by default
    the system's own check)."""
    settle(dsn)
    run = run_workers(system, dsn, processes, workdir, "run", timeout)
    accounting = (verify or system.verify)(dsn, rows, run.id_files)
    return DrainResult(
        system=system.name,
        rows=rows,
        processes=processes,
        wall_seconds=run.seconds,
        idle_seconds=idle.seconds,
        rate=net_rate(rows, run.seconds, idle.seconds),
        gross_rate=rows / run.seconds if run.seconds > 0 else 0.0,
        accounting=accounting,
        error=run.error,
        cpu_seconds=run.cpu_seconds,
        idle_cpu_seconds=idle.cpu_seconds,
    )


def run_case(
    server: BenchServer,
    system: DrainSystem,
    rows: int,
    processes: int,
    *,
    idle_cache: dict[tuple[str, int], Idle] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> DrainResult:
    """One system draining `rows` jobs with `processes` worker processes."""
    cache = idle_cache if idle_cache is not None else {}
    with (
        server.database(system.label, leasebox_schema=system.needs_leasebox_schema) as dsn,
        tempfile.TemporaryDirectory(prefix="leasebox-bench-") as tmp,
    ):
        workdir = Path(tmp)
        try:
            system.seed(dsn, 0)
            key = (system.name, processes)
            if key not in cache:
                idle = measure_idle(system, dsn, processes, workdir)
                if isinstance(idle, str):
                    return failed(system.name, rows, processes, idle)
                cache[key] = idle
            system.seed(dsn, rows)
            return timed_drain(system, dsn, rows, processes, workdir, cache[key], timeout=timeout)
        except (RuntimeError, psycopg.Error, OSError) as exc:
            return failed(system.name, rows, processes, str(exc))


def keep_better(current: DrainResult | None, new: DrainResult) -> DrainResult:
    """The run to report: the fastest exactly-once run, else the first failure."""
    if current is None:
        return replace(new, attempt_rates=(new.rate,))
    if new.ok and (not current.ok or new.rate > current.rate):
        return replace(new, attempt_rates=(*current.attempt_rates, new.rate))
    return replace(current, attempt_rates=(*current.attempt_rates, new.rate))


def run_drain(
    server: BenchServer,
    systems: list[DrainSystem],
    plan: list[tuple[int, int]],
    *,
    best_of: dict[int, int] | None = None,
    progress: Callable[[DrainResult], None] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[DrainResult]:
    """Every system over every (rows, processes) of `plan`, peers side by side per case.

    `best_of` maps a row count to how many rounds to run; each round runs every system once
    (so a burst of load on the machine hits a round, not one system), and the fastest
    exactly-once run of each system is kept.
    """
    idle_cache: dict[tuple[str, int], Idle] = {}
    results: list[DrainResult] = []
    for rows, processes in plan:
        best: dict[str, DrainResult | None] = {system.name: None for system in systems}
        for _ in range((best_of or {}).get(rows, 1)):
            for system in systems:
                result = run_case(
                    server, system, rows, processes, idle_cache=idle_cache, timeout=timeout
                )
                best[system.name] = keep_better(best[system.name], result)
                if progress is not None:
                    progress(result)
        results.extend(r for r in best.values() if r is not None)
    return results
