"""Settling sent and failed messages in batches, as group commits.

A send's outcome is queued here and the send's slot is free at once; one flusher task takes
everything queued, writes it with at most one statement per outcome type (`mark_sent`,
`schedule_retry`, `mark_dead`, `release_leases`), and while that statement runs the next
batch accumulates. Under load a statement settles dozens of rows; when idle it settles one
with no added delay.

Each statement matches rows on their lease token, so an id missing from its answer is a
lease this worker lost (it stalled past the lease and another worker reclaimed the row):
that is counted and logged, never retried. A database error keeps the batch and retries it
with backoff; the statements are idempotent for rows still owned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from leasebox import claiming
from leasebox.claiming import ClaimedMessage, Dead, LeaseRef, Retry, Sent
from leasebox.metrics import WorkerMetrics
from leasebox.upkeep import message_fields

log = logging.getLogger("leasebox.worker")

DATABASE_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, TimeoutError)
_RETRY_FIRST = 0.1
_RETRY_MAX = 5.0


@dataclass(frozen=True)
class Outcome:
    """What happened to one claimed message, waiting to be written."""

    message: ClaimedMessage
    action: Sent | Retry | Dead | LeaseRef

    @property
    def lease(self) -> LeaseRef:
        return self.action if isinstance(self.action, LeaseRef) else self.action.lease


class CompletionBatcher:
    """Queues outcomes and writes them in batches; `on_settled(id)` fires once per row."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        metrics: WorkerMetrics,
        *,
        schema: str,
        clock: Callable[[], datetime | None],
        on_settled: Callable[[int], None],
        statement_timeout: float = 30.0,
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        self._schema = schema
        self._clock = clock
        self._on_settled = on_settled
        self._timeout = statement_timeout
        self._queue: list[Outcome] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.failing: str | None = None

    def put(self, outcome: Outcome) -> None:
        self._queue.append(outcome)
        self._idle.clear()
        self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def run(self, deadline: Callable[[], float | None] = lambda: None) -> None:
        """Flush until cancelled, or until `close()` and nothing is left.

        `deadline()` is a monotonic time after which a failing database is given up on
        (None: keep trying), consulted only while closing.
        """
        delay = _RETRY_FIRST
        while True:
            if not self._queue:
                self._idle.set()
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            batch, self._queue = self._queue, []
            groups: dict[type, list[Outcome]] = {}
            for outcome in batch:
                groups.setdefault(type(outcome.action), []).append(outcome)
            try:
                async with asyncio.timeout(self._timeout):
                    await self._write(groups)
            except DATABASE_ERRORS as exc:
                self._queue[:0] = [o for outcomes in groups.values() for o in outcomes]
                self.failing = f"database unavailable ({type(exc).__name__})"
                limit = deadline() if self._closing else None
                if limit is not None and time.monotonic() + delay > limit:
                    self._give_up()
                    return
                log.warning(
                    "could not record %d outcomes, retrying in %.1fs",
                    len(self._queue),
                    delay,
                    extra={"error_class": type(exc).__name__},
                )
                await asyncio.sleep(delay)
                delay = min(_RETRY_MAX, delay * 2)
            else:
                if self.failing:
                    log.info("outcomes recorded again: the database is back")
                self.failing = None
                delay = _RETRY_FIRST

    async def close(self, within: float) -> None:
        """Write what is queued (within `within` seconds), then let `run` return."""
        self._closing = True
        self._ready.set()
        try:
            async with asyncio.timeout(within):
                await self._idle.wait()
        except TimeoutError:
            self._give_up()

    def _give_up(self) -> None:
        if self._queue:
            log.error(
                "%d outcomes were not recorded; their rows return when their leases expire",
                len(self._queue),
                extra={"count": len(self._queue)},
            )
        for outcome in self._queue:
            self._on_settled(outcome.message.id)
        self._queue = []
        self._idle.set()

    async def _write(self, groups: dict[type, list[Outcome]]) -> None:
        """One statement per outcome type; a group written is removed from `groups`."""
        async with self._pool.connection() as conn:
            for kind in list(groups):
                outcomes = groups[kind]
                now = self._clock()
                if kind is Sent:
                    sent = [o.action for o in outcomes if isinstance(o.action, Sent)]
                    latencies = await claiming.mark_sent(conn, sent, schema=self._schema, now=now)
                    del groups[kind]
                    self._after_sent(outcomes, latencies)
                    continue
                if kind is Retry:
                    retries = [o.action for o in outcomes if isinstance(o.action, Retry)]
                    ids = await claiming.schedule_retry(conn, retries, schema=self._schema, now=now)
                    done = self._retried
                elif kind is Dead:
                    dead = [o.action for o in outcomes if isinstance(o.action, Dead)]
                    ids = await claiming.mark_dead(conn, dead, schema=self._schema, now=now)
                    done = self._dead
                else:
                    leases = [o.lease for o in outcomes]
                    ids = await claiming.release_leases(conn, leases, schema=self._schema, now=now)
                    done = self._released
                del groups[kind]
                self._after(outcomes, ids, done)

    def _after_sent(self, outcomes: list[Outcome], latencies: dict[int, float]) -> None:
        for outcome in outcomes:
            message = outcome.message
            latency = latencies.get(message.id)
            if latency is None:
                self._lost(outcome, "sent")
            else:
                series = self._metrics.kind(message.kind)
                series.sent.inc()
                series.delivery_latency.observe(max(latency, 0.0))
                if log.isEnabledFor(logging.DEBUG):
                    assert isinstance(outcome.action, Sent)
                    log.debug(
                        "sent",
                        extra={
                            **message_fields(message),
                            "provider_message_id": outcome.action.provider_message_id,
                        },
                    )
            self._on_settled(message.id)

    def _after(
        self, outcomes: list[Outcome], ids: set[int], done: Callable[[Outcome], None]
    ) -> None:
        for outcome in outcomes:
            if outcome.message.id in ids:
                done(outcome)
            elif not isinstance(outcome.action, LeaseRef):
                self._lost(outcome, type(outcome.action).__name__.lower())
            self._on_settled(outcome.message.id)

    def _retried(self, outcome: Outcome) -> None:
        action = outcome.action
        assert isinstance(action, Retry)
        self._metrics.retries.labels(outcome.message.kind, action.error_class).inc()
        log.info(
            "send failed, retry in %.1fs: %s",
            action.delay_seconds,
            action.error,
            extra={**message_fields(outcome.message), "error_class": action.error_class},
        )

    def _dead(self, outcome: Outcome) -> None:
        action = outcome.action
        assert isinstance(action, Dead)
        self._metrics.dead_letters.labels(outcome.message.kind, action.reason).inc()
        log.warning(
            "dead-lettered (%s): %s",
            action.reason,
            action.error,
            extra={
                **message_fields(outcome.message),
                "error_class": action.error_class,
                "reason": action.reason,
            },
        )

    def _released(self, outcome: Outcome) -> None:
        log.debug("lease released unsent", extra=message_fields(outcome.message))

    def _lost(self, outcome: Outcome, what: str) -> None:
        self._metrics.kind(outcome.message.kind).lease_lost.inc()
        log.warning(
            "lease lost before the outcome (%s) was recorded; another worker owns the row",
            what,
            extra=message_fields(outcome.message),
        )
