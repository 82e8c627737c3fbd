"""PgQueuer as a drain peer, with its fastest documented settings for short jobs.

Settings: the asyncpg driver (PgQueuer's default and the one its own benchmark uses), the
uvloop event loop (a dependency of PgQueuer, used by its CLI and benchmark), `batch_size`
100 per dequeue, no cap on concurrent tasks, `mode=drain` so the process exits when the
queue is empty. Finished jobs leave the queue table, so each handler records its payload
number for the exactly-once check.
Run as `python -m bench.peer_pgqueuer seed|work --dsn URL` (`seed --rows 0` installs).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import asyncpg
import uvloop
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

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
