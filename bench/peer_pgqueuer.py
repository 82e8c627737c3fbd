"""PgQueuer as a drain peer, with its fastest documented settings for short jobs.

Settings: the asyncpg driver (PgQueuer's default and the one its own benchmark uses), the
uvloop event loop (a dependency of PgQueuer, used by its CLI and benchmark), `batch_size`
100 per dequeue, no cap on concurrent tasks, `mode=drain` so the process exits when the
queue is empty. Finished jobs leave the queue table, so each handler records its payload
number for the exactly-once check.
Run as `python -m bench.peer_pgqueuer seed|work --dsn URL` (`seed --rows 0` installs).

As a producer (the enqueue benchmark, `timed_enqueue`), it sends through its own public API,
`Queries.enqueue`, each job with a `dedupe_key`: scalars for one job per call (one
transaction each), lists for a batch in one call, with the default `on_conflict` (a
duplicate key raises; `skip` adds an `ON CONFLICT` arbiter).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import asyncpg
import uvloop
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

from bench.enqueue_peers import dedupe_key, job_payload
from bench.peer_cli import chunks, parse, payload, write_ids

ENTRYPOINT = "otp"
SETTINGS: dict[str, Any] = {
    "driver": "asyncpg",
    "event_loop": "uvloop",
    "batch_size": 100,
    "max_concurrent_tasks": None,
    "mode": "drain",
}


async def seed(dsn: str, rows: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if rows == 0:
            await queries.install()
        for part in chunks(rows):
            await queries.enqueue(
                [ENTRYPOINT] * len(part),
                [json.dumps(payload(i)).encode() for i in part],
                [0] * len(part),
            )
    finally:
        await conn.close()


async def _enqueue(queries: Queries, numbers: range, per_call: int) -> None:
    if per_call == 1:
        for i in numbers:
            await queries.enqueue(ENTRYPOINT, job_payload(i), 0, dedupe_key=dedupe_key(i))
        return
    await queries.enqueue(
        [ENTRYPOINT] * len(numbers),
        [job_payload(i) for i in numbers],
        [0] * len(numbers),
        dedupe_key=[dedupe_key(i) for i in numbers],
    )


async def _timed_enqueue(dsn: str, batches: list[range], warm: list[range], per_call: int) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await conn.execute("ANALYZE")
        for numbers in warm:
            await _enqueue(queries, numbers, per_call)
        start = time.perf_counter()
        for numbers in batches:
            await _enqueue(queries, numbers, per_call)
        return time.perf_counter() - start
    finally:
        await conn.close()


def timed_enqueue(dsn: str, batches: list[range], warm: list[range], per_call: int) -> float:
    """Install PgQueuer's schema in `dsn`, analyse it, send `warm` untimed, then the seconds
    `batches` take: one job per call (and per transaction) when `per_call` is 1, else each
    batch in one call."""
    return uvloop.run(_timed_enqueue(dsn, batches, warm, per_call))


async def work(dsn: str, batch_size: int) -> list[int]:
    seen: list[int] = []
    conn = await asyncpg.connect(dsn)
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def otp(job: Job) -> None:
            seen.append(int(json.loads(job.payload or b"{}")["i"]))

        await qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
    finally:
        await conn.close()
    return seen


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "PgQueuer as a drain peer")
    if args.mode == "seed":
        uvloop.run(seed(args.dsn, args.rows))
    else:
        write_ids(args.ids_file, uvloop.run(work(args.dsn, args.batch_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
