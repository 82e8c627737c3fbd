"""The systems the drain benchmark compares, each with its settings, version and checks.

A system knows how to seed N jobs into a fresh database (not timed), which command starts
one of its worker processes, and how to prove afterwards that every job ran exactly once:
from its own table where it keeps finished jobs, and from the payload numbers its handlers
recorded where it does not. leasebox and the plain loops count attempts at claim, so
`attempts = 1` on every sent row is the proof.

Two of the systems are yardsticks, not peers: the plain loop on a minimal outbox table (the
workload's limit on this machine) and the same loop on leasebox's own schema.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

from bench import node_peers
from bench.accounting import Accounting, account_ids, account_table, combine
from bench.sqlfiles import bench_query
from leasebox.producer.payload_crypto import default_cipher

ROOT = Path(__file__).resolve().parent.parent
SEED_CHUNK = 50_000
LEASEBOX = "leasebox"
PLAIN_MINIMAL = "plain loop, minimal table"
PLAIN_LEASEBOX_SCHEMA = "plain loop, leasebox schema"
STATEMENTS_WITH_HISTORY = "leasebox's statements, history on"
STATEMENTS_WITHOUT_HISTORY = "leasebox's statements, history cut out"
YARDSTICKS = frozenset(
    {PLAIN_MINIMAL, PLAIN_LEASEBOX_SCHEMA, STATEMENTS_WITH_HISTORY, STATEMENTS_WITHOUT_HISTORY}
)


def python_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def leasebox_command() -> list[str]:
    script = Path(sys.executable).parent / "leasebox"
    return [str(script)] if script.exists() else [shutil.which("leasebox") or "leasebox"]


def leasebox_worker_ready() -> bool:
    """Whether this leasebox has its worker command yet."""
    result = subprocess.run(
        [*leasebox_command(), "worker", "--help"], capture_output=True, check=False, cwd=ROOT
    )
    return result.returncode == 0


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class DrainSystem:
    """One queue implementation as the drain benchmark drives it."""

    name: str
    label: str
    version: str
    settings: dict[str, Any]
    needs_leasebox_schema: bool
    seed: Callable[[str, int], None]
    worker_command: Callable[[str, Path], list[str]]
    verify: Callable[[str, int, list[Path]], Accounting]
    records_ids: bool = False
    notes: list[str] = field(default_factory=list)


def _run_seed(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"seeding failed: {' | '.join(tail)}")


def seed_outbox(dsn: str, rows: int, first: int = 0) -> None:
    """Ready OTP rows in leasebox's outbox, as `leasebox.enqueue` would write them, numbered
    from `first` (delivery keys are unique, so a second batch starts past the first)."""
    secrets = default_cipher().seal({"code": "246810"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(first, first + rows, SEED_CHUNK):
            count = min(SEED_CHUNK, first + rows - start)
            conn.execute(
                bench_query("seed_ready"), {"first": start, "count": count, "secrets": secrets}
            )


def verify_outbox(dsn: str, rows: int, _: list[Path]) -> Accounting:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(bench_query("outbox_accounting"), {"first_id": 0}).fetchone()
    return _outbox_accounting(rows, row)


def verify_outbox_from(first_id: int) -> Callable[[str, int, list[Path]], Accounting]:
    """`verify_outbox` for the rows seeded from `first_id` on (others are history)."""

    def verify(dsn: str, rows: int, _: list[Path]) -> Accounting:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                bench_query("outbox_accounting_from"), {"first_id": first_id}
            ).fetchone()
        return _outbox_accounting(rows, row)

    return verify


def seed_minimal(dsn: str, rows: int) -> None:
    """The minimal table (`rows == 0`) or `rows` ready jobs on it."""
    from bench.plain_worker import MINIMAL_SCHEMA

    with psycopg.connect(dsn, autocommit=True) as conn:
        if rows == 0:
            conn.execute(bench_query("minimal_schema", MINIMAL_SCHEMA))
        for first in range(0, rows, SEED_CHUNK):
            count = min(SEED_CHUNK, rows - first)
            conn.execute(
                bench_query("minimal_seed", MINIMAL_SCHEMA), {"first": first, "count": count}
            )


def verify_minimal(dsn: str, rows: int, _: list[Path]) -> Accounting:
    from bench.plain_worker import MINIMAL_SCHEMA

    with psycopg.connect(dsn) as conn:
        row = conn.execute(bench_query("minimal_accounting", MINIMAL_SCHEMA)).fetchone()
    return _outbox_accounting(rows, row)


def _outbox_accounting(rows: int, row: tuple[Any, ...] | None) -> Accounting:
    if row is None:
        raise RuntimeError("the accounting query returned no row")
    total, sent, once, more, unfinished, dead = (int(v) for v in row)
    note = f"{sent} sent, {unfinished} unfinished, {dead} dead"
    return account_table(rows, total, once, more, note)


def read_ids(files: list[Path]) -> list[int]:
    seen: list[int] = []
    for path in files:
        if path.exists():
            seen.extend(int(i) for i in json.loads(path.read_text("utf-8")))
    return seen


def _left_over_check(statement: str, what: str) -> Callable[[str, int, list[Path]], Accounting]:
    def verify(dsn: str, rows: int, files: list[Path]) -> Accounting:
        with psycopg.connect(dsn) as conn:
            found = conn.execute(bench_query(statement)).fetchone()
        left = int(found[0]) if found else -1
        by_ids = account_ids(rows, read_ids(files), "handler records")
        table = Accounting(rows, rows - left, left, 0, 0, f"{left} {what} left in its table")
        return combine(by_ids, table)

    return verify


def _status_check(statement: str) -> Callable[[str, int, list[Path]], Accounting]:
    def verify(dsn: str, rows: int, files: list[Path]) -> Accounting:
        with psycopg.connect(dsn) as conn:
            found = conn.execute(bench_query(statement)).fetchone()
        assert found is not None
        done, retried, total = (int(v) for v in found)
        by_ids = account_ids(rows, read_ids(files), "handler records")
        note = f"{done} completed, {retried} retried, {total} in its table"
        table = Accounting(rows, done, rows - done, retried, max(total - rows, 0), note)
        return combine(by_ids, table)

    return verify


# Claim as many rows per statement as the plain baseline and PgQueuer do (100); the worker's
# default batch is its concurrency (32), which keeps fewer rows leased per process.
LEASEBOX_BATCH_FLAGS = ("--batch-size", "100")
# A no-op send (`null://`) never waits, so the senders work through a claimed batch without
# letting the claim loop run: the next claim goes out while a batch is still unsent only if
# the worker may hold more than one batch beyond its senders (concurrency + batch size rows
# not yet sent). 200 sends in flight let the claims run back to back, as PgQueuer runs its
# no-op jobs with no cap on concurrent tasks (bench/README.md has the sweep).
LEASEBOX_SHORT_JOB_FLAGS = (*LEASEBOX_BATCH_FLAGS, "--concurrency", "200")


def leasebox_system(
    extra_args: list[str] | None = None,
    *,
    provider: str = "null://",
    name: str = LEASEBOX,
    verify: Callable[[str, int, list[Path]], Accounting] | None = None,
) -> DrainSystem:
    """`leasebox worker --drain` through `provider` (by default the null one)."""
    extra = list(LEASEBOX_SHORT_JOB_FLAGS if extra_args is None else extra_args)

    def command(dsn: str, _: Path) -> list[str]:
        return [
            *leasebox_command(),
            "worker",
            "--drain",
            "--provider",
            provider,
            "--kinds",
            "otp",
            "--dsn",
            dsn,
            "--metrics-port",
            "0",
            *extra,
        ]

    return DrainSystem(
        name=name,
        label="leasebox",
        version=_version("leasebox"),
        settings={
            "command": f"leasebox worker --drain --provider {provider.split('?')[0]}",
            "flags": " ".join(extra) or "defaults",
        },
        needs_leasebox_schema=True,
        seed=seed_outbox,
        worker_command=command,
        verify=verify or verify_outbox,
    )


def _plain_command(table: str) -> Callable[[str, Path], list[str]]:
    def command(dsn: str, ids: Path) -> list[str]:
        return [
            *python_module("bench.plain_worker"),
            "work",
            "--dsn",
            dsn,
            "--batch-size",
            "100",
            "--table",
            table,
            "--ids-file",
            str(ids),
        ]

    return command


PLAIN_SETTINGS = {
    "claim": "one UPDATE ... FOR UPDATE SKIP LOCKED of 100 rows",
    "complete": "one UPDATE of the batch, guarded by the lease token",
    "connection": "one sync psycopg connection, autocommit",
}


def verify_queue_emptied(dsn: str, rows: int, files: list[Path]) -> Accounting:
    """The plain loop on leasebox's schema keeps no history: each message left the queue,
    and the loops' records name each one once (the ids their completions deleted)."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(bench_query("outbox_accounting"), {"first_id": 0}).fetchone()
    if found is None:
        raise RuntimeError("the accounting query returned no row")
    total, sent, _, _, unfinished, dead = (int(v) for v in found)
    note = f"{sent} sent, {unfinished} unfinished, {dead} dead"
    table = Accounting(rows, sent, rows - sent, 0, max(total - rows, 0), note)
    return combine(account_ids(rows, read_ids(files), "loop records"), table)


def plain_system() -> DrainSystem:
    """The plain loop on leasebox's own tables: what the schema allows."""
    return DrainSystem(
        name=PLAIN_LEASEBOX_SCHEMA,
        label="plain",
        version=f"psycopg {_version('psycopg')}",
        settings={
            **PLAIN_SETTINGS,
            "complete": "one DELETE of the batch from the queue, guarded by the lease token",
            "table": "leasebox.queue, each message's data read from leasebox.outbox",
        },
        needs_leasebox_schema=True,
        seed=seed_outbox,
        worker_command=_plain_command("leasebox"),
        verify=verify_queue_emptied,
        records_ids=True,
    )


def statements_system(history: bool = True) -> DrainSystem:
    """The plain loop running leasebox's own `claim` and `mark_sent`, as shipped or with
    their attempt-history inserts cut out: what the history costs the database."""
    return DrainSystem(
        name=STATEMENTS_WITH_HISTORY if history else STATEMENTS_WITHOUT_HISTORY,
        label="statements" if history else "statements-no-history",
        version="this tree",
        settings={
            **PLAIN_SETTINGS,
            "claim": "leasebox's `claim` statement, 100 rows",
            "complete": "leasebox's `mark_sent` statement"
            + ("" if history else ", both with their history inserts cut out"),
            "table": "leasebox's queue, outbox and history",
        },
        needs_leasebox_schema=True,
        seed=seed_outbox,
        worker_command=_plain_command("statements" if history else "statements-no-history"),
        # Without its history inserts, a send leaves no record but the loop's own.
        verify=verify_outbox if history else verify_queue_emptied,
        records_ids=True,
    )


def plain_minimal_system() -> DrainSystem:
    """The plain loop on a minimal outbox table: the workload's limit."""
    return DrainSystem(
        name=PLAIN_MINIMAL,
        label="minimal",
        version=f"psycopg {_version('psycopg')}",
        settings={
            **PLAIN_SETTINGS,
            "table": "id, status, attempts, lease_token, payload; primary key and one "
            "partial index on ready rows",
        },
        needs_leasebox_schema=False,
        seed=seed_minimal,
        worker_command=_plain_command("minimal"),
        verify=verify_minimal,
    )


def pgqueuer_system() -> DrainSystem:
    from bench.peer_pgqueuer import SETTINGS

    def command(dsn: str, ids: Path) -> list[str]:
        return [
            *python_module("bench.peer_pgqueuer"),
            "work",
            "--dsn",
            dsn,
            "--ids-file",
            str(ids),
            "--batch-size",
            "100",
        ]

    def seed(dsn: str, rows: int) -> None:
        _run_seed(
            [*python_module("bench.peer_pgqueuer"), "seed", "--dsn", dsn, "--rows", str(rows)]
        )

    return DrainSystem(
        name="PgQueuer",
        label="pgqueuer",
        version=_version("pgqueuer"),
        settings=SETTINGS,
        needs_leasebox_schema=False,
        seed=seed,
        worker_command=command,
        verify=_left_over_check("pgqueuer_left", "jobs"),
        records_ids=True,
    )


def procrastinate_system() -> DrainSystem:
    from bench.peer_procrastinate import SETTINGS

    def command(dsn: str, ids: Path) -> list[str]:
        return [
            *python_module("bench.peer_procrastinate"),
            "work",
            "--dsn",
            dsn,
            "--ids-file",
            str(ids),
        ]

    def seed(dsn: str, rows: int) -> None:
        _run_seed(
            [*python_module("bench.peer_procrastinate"), "seed", "--dsn", dsn, "--rows", str(rows)]
        )

    return DrainSystem(
        name="Procrastinate",
        label="procrastinate",
        version=_version("procrastinate"),
        settings=SETTINGS,
        needs_leasebox_schema=False,
        seed=seed,
        worker_command=command,
        verify=_status_check("procrastinate_accounting"),
        records_ids=True,
        notes=["fetches one job per round trip; there is no batch fetch to enable"],
    )


def _node_system(
    name: str,
    label: str,
    package: str,
    script: str,
    settings: dict[str, Any],
    verify: Callable[[str, int, list[Path]], Accounting],
) -> DrainSystem:
    node = node_peers.node_binary() or "node"
    path = str(node_peers.script(script))

    def command(dsn: str, ids: Path) -> list[str]:
        return [node, path, "work", "--dsn", dsn, "--ids-file", str(ids)]

    def seed(dsn: str, rows: int) -> None:
        _run_seed([node, path, "seed", "--dsn", dsn, "--rows", str(rows)])

    version = node_peers.installed_version(package) or "not installed"
    return DrainSystem(
        name=name,
        label=label,
        version=version,
        settings={**settings, "node": node_peers.node_version()},
        needs_leasebox_schema=False,
        seed=seed,
        worker_command=command,
        verify=verify,
        records_ids=True,
    )


def pgboss_system() -> DrainSystem:
    return _node_system(
        "pg-boss",
        "pgboss",
        "pg-boss",
        "pgboss.js",
        {
            "batchSize": 1000,
            "pollingIntervalSeconds": 0.5,
            "work() subscriptions": 16,
            "pool max": 18,
            "supervise": False,
            "drain": "stops when nothing is queued or active",
        },
        _status_check("pgboss_accounting"),
    )


def graphile_system() -> DrainSystem:
    return _node_system(
        "graphile-worker",
        "graphile",
        "graphile-worker",
        "graphile.js",
        {"concurrentJobs": 24, "maxPoolSize": 25, "mode": "runOnce", "per-job logging": "off"},
        _left_over_check("graphile_left", "jobs"),
    )


FACTORIES: dict[str, Callable[[], DrainSystem]] = {
    "leasebox": leasebox_system,
    "minimal": plain_minimal_system,
    "plain": plain_system,
    "statements": statements_system,
    "statements-no-history": lambda: statements_system(history=False),
    "pgqueuer": pgqueuer_system,
    "procrastinate": procrastinate_system,
    "pgboss": pgboss_system,
    "graphile": graphile_system,
}
NODE_SYSTEMS = frozenset({"pgboss", "graphile"})
