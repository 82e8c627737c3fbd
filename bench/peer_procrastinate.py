"""Procrastinate as a drain peer, with its fastest documented settings for short jobs.

Procrastinate fetches one job per round trip (`procrastinate_fetch_job_v2`) and finishes
each with its own statement; there is no batch fetch to turn on. What it offers for short
async jobs is `concurrency`: that many sub-workers, each fetching and finishing in turn,
over a psycopg pool sized to match. `wait=False` makes the worker exit once the queue is
empty. Jobs are kept after success (`delete_jobs="never"`, the default), so the jobs
table is checked as well as the records of the handlers.
Run as `python -m bench.peer_procrastinate seed|work --dsn URL` (`seed --rows 0` installs).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

import procrastinate

from bench.peer_cli import chunks, parse, payload, write_ids

QUEUE = "otp"
DEFAULT_CONCURRENCY = 4
SETTINGS: dict[str, Any] = {
    "concurrency": DEFAULT_CONCURRENCY,
    "pool_max_size": DEFAULT_CONCURRENCY + 2,
    "wait": False,
    "listen_notify": True,
    "delete_jobs": "never",
    "jobs_per_fetch": 1,
}


def make_app(dsn: str, pool_size: int, seen: list[int]) -> tuple[procrastinate.App, Any]:
    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size)
    app = procrastinate.App(connector=connector)

    @app.task(name="otp", queue=QUEUE)
    async def otp(i: int, recipient: str, template: str, data: dict[str, Any]) -> None:
        seen.append(i)

    return app, otp


async def seed(dsn: str, rows: int) -> None:
    app, task = make_app(dsn, 2, [])
    async with app.open_async():
        if rows == 0:
            await app.schema_manager.apply_schema_async()
        for part in chunks(rows):
            await task.batch_defer_async(*(payload(i) for i in part))


async def work(dsn: str, concurrency: int) -> list[int]:
    seen: list[int] = []
    app, _ = make_app(dsn, concurrency + 2, seen)
    async with app.open_async():
        await app.run_worker_async(
            queues=[QUEUE],
            concurrency=concurrency,
            wait=False,
            listen_notify=True,
            delete_jobs="never",
            install_signal_handlers=False,
        )
    return seen


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "Procrastinate as a drain peer")
    if args.mode == "seed":
        asyncio.run(seed(args.dsn, args.rows))
    else:
        write_ids(
            args.ids_file, asyncio.run(work(args.dsn, args.concurrency or DEFAULT_CONCURRENCY))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
