"""The peers' producers in the enqueue benchmark: what a user compares `leasebox.enqueue` with.

A receipt-keyed send writes three rows and probes one; a plain `INSERT` writes one, so it
bounds leasebox from above but is not a queue. The peers are: PgQueuer's `Queries.enqueue`
with a `dedupe_key` (asyncpg, as its worker runs), and pg-boss's `send` with a
`singletonKey` and `insert([...])` for a batch (`bench/node/pgboss_enqueue.js`). Each runs
on a fresh database of the same server, its schema freshly installed and analysed, with the
same messages, a fresh key per message (a login storm), the same warm-up as leasebox's
cases, and only the sends timed, in its own process's clock. Every case then counts the
jobs in the peer's own table: a case that wrote a job too many or too few has no rate.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from collections.abc import Callable, Iterable

import psycopg

from bench import node_peers
from bench.pgserver import BenchServer
from bench.sqlfiles import bench_query
from bench.systems import ROOT

PGQUEUER = "PgQueuer Queries.enqueue + dedupe_key"
PGBOSS_ONE = "pg-boss send + singletonKey"
PGBOSS_MANY = "pg-boss insert + singletonKey"
PEERS = ("pgqueuer", "pgboss")
NODE_TIMEOUT_SECONDS = 900


def available(wanted: Iterable[str] = PEERS) -> tuple[tuple[str, ...], dict[str, str]]:
    """The peers this machine can run, and why each other one is skipped."""
    found: list[str] = []
    skipped: dict[str, str] = {}
    for name in wanted:
        if name == "pgqueuer" and importlib.util.find_spec("pgqueuer") is None:
            skipped[name] = "install the bench extra (pip install -e '.[bench]')"
        elif name == "pgboss" and (why := node_peers.ensure_installed()) is not None:
            skipped[name] = why
        else:
            found.append(name)
    return tuple(found), skipped


def method(peer: str, per_call: int) -> str:
    """The name a peer's producer call is reported under."""
    if peer == "pgqueuer":
        return PGQUEUER
    return PGBOSS_ONE if per_call == 1 else PGBOSS_MANY


def job_payload(number: int) -> bytes:
    """A peer's job: leasebox's OTP message as a peer carries it (the code in clear: the
    peers have no sealed secrets). `bench/node/common.js` builds the same for pg-boss."""
    return json.dumps(
        {
            "kind": "otp",
            "recipient": f"user{number}@example.com",
            "aggregate_id": f"user-{number}",
            "template": "otp",
            "data": {"name": f"User {number}", "minutes_valid": 10},
            "code": f"{abs(number) % 1000000:06d}",
        }
    ).encode()


def dedupe_key(number: int) -> str:
    """A fresh key per message, as a login storm has: the key leasebox's receipt gets."""
    return f"otp-request-{number}"


def _count(dsn: str, statement: str, column: int = 0) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(bench_query(statement)).fetchone()
    return int(row[column]) if row else 0


def pgqueuer_seconds(dsn: str, batches: list[range], warm: list[range], per_call: int) -> float:
    from bench.peer_pgqueuer import timed_enqueue

    return timed_enqueue(dsn, batches, warm, per_call)


def pgboss_seconds(dsn: str, count: int, per_call: int) -> float:
    node = node_peers.node_binary()
    if node is None:
        raise RuntimeError("node is not installed")
    command = [
        node,
        str(node_peers.script("pgboss_enqueue.js")),
        "enqueue",
        "--dsn",
        dsn,
        "--rows",
        str(count),
        "--per-call",
        str(per_call),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=NODE_TIMEOUT_SECONDS,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"pg-boss enqueue failed: {' | '.join(tail)}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def peer_case(
    server: BenchServer,
    peer: str,
    count: int,
    per_call: int,
    batches: Callable[[int, int], list[range]],
    warm: list[range],
) -> tuple[float, int]:
    """The seconds `count` sends took through `peer`'s producer, and the jobs its table holds
    afterwards (warm-up included), on a database of its own."""
    with server.database(f"enqueue_{peer}", leasebox_schema=False) as dsn:
        if peer == "pgqueuer":
            seconds = pgqueuer_seconds(dsn, batches(count, per_call), warm, per_call)
            return seconds, _count(dsn, "pgqueuer_left")
        seconds = pgboss_seconds(dsn, count, per_call)
        # pg-boss's accounting: completed, retried, and every job of the queue (the third).
        return seconds, _count(dsn, "pgboss_accounting", 2)
