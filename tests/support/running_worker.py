"""A `Worker` running in the test's own event loop, and what the tests watch it by.

The worker's tests share one set of settings (short polls, no LISTEN), a way to start and
always stop a worker, and the signals they wait for instead of sleeping: the worker's own
`rounds` (how often it claimed and checked its leases) and the log records it emits,
captured on the `leasebox` logger itself, so that no earlier test's logging setup (which
stops propagation to the root logger) can hide them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.rendering import TemplateRenderer
from leasebox.runtime.logs import LOGGER_NAME
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.worker import Worker
from support.worker_doubles import ScriptedProvider

SETTINGS = WorkerSettings(
    kinds=("otp", "invite"),
    concurrency=4,
    batch_size=4,
    lease_seconds=45,
    poll_interval=0.02,
    listen=False,
    grace_seconds=5,
    worker_id="test-worker",
)


def bottom_of_the_jitter() -> float:
    """A draw of 0: the backoff is half its ceiling."""
    return 0.0


def no_jitter() -> float:
    """A draw of 1: the backoff is its whole ceiling, `min(cap, base * 2**(attempt-1))`."""
    return 1.0


def make_worker(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    clock: Callable[[], datetime | None],
    settings: WorkerSettings = SETTINGS,
    *,
    dsn: str | None = None,
    rng: Callable[[], float] = bottom_of_the_jitter,
) -> Worker:
    return Worker(
        settings, db_pool, fake_provider, TemplateRenderer(), dsn=dsn, clock=clock, rng=rng
    )


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Run `worker` for the body of the block; stop it and wait for it afterwards."""
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield task
    finally:
        worker.request_stop()
        async with asyncio.timeout(30):
            await task


class Records(logging.Handler):
    """Every record the `leasebox` loggers emit while installed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def about(self, outbox_id: int, message: str) -> bool:
        """Whether a record saying `message` was logged about row `outbox_id`."""
        return any(
            getattr(r, "outbox_id", None) == outbox_id and r.getMessage() == message
            for r in self.records
        )


@contextlib.contextmanager
def log_records() -> Iterator[Records]:
    """Capture the `leasebox` loggers' records, at debug level, for the body of the block."""
    logger = logging.getLogger(LOGGER_NAME)
    handler = Records()
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
