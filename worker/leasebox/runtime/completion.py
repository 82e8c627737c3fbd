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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from psycopg_pool import AsyncConnectionPool

from leasebox.db.connections import DATABASE_ERRORS
from leasebox.runtime.logs import message_fields
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.store import settling
from leasebox.store.claiming import ClaimedMessage, Connection, LeaseRef
from leasebox.store.settling import Dead, Release, Retry, Sent, Settlement

log = logging.getLogger("leasebox.worker")

_RETRY_FIRST = 0.1
_RETRY_MAX = 5.0
_A = TypeVar("_A", Sent, Retry, Dead, Release)


@dataclass(frozen=True)
class Outcome:
    """What happened to one claimed message, waiting to be written."""

    message: ClaimedMessage
    action: Settlement

    @property
    def lease(self) -> LeaseRef:
        return self.action.lease


def _actions(outcomes: Sequence[Outcome], kind: type[_A]) -> list[_A]:
    return [o.action for o in outcomes if isinstance(o.action, kind)]


# The rows of a batch whose lease still matched, by id (with their latency for `sent`).
_Matched = Mapping[int, float | None]
_Writer = Callable[[Connection, Sequence[Outcome], str, datetime | None], Awaitable[_Matched]]


async def _write_sent(
    conn: Connection, outcomes: Sequence[Outcome], schema: str, now: datetime | None
) -> _Matched:
    return await settling.mark_sent(conn, _actions(outcomes, Sent), schema=schema, now=now)


async def _write_retries(
    conn: Connection, outcomes: Sequence[Outcome], schema: str, now: datetime | None
) -> _Matched:
    retries = _actions(outcomes, Retry)
    return dict.fromkeys(await settling.schedule_retry(conn, retries, schema=schema, now=now))


async def _write_dead(
    conn: Connection, outcomes: Sequence[Outcome], schema: str, now: datetime | None
) -> _Matched:
    dead = _actions(outcomes, Dead)
    return dict.fromkeys(await settling.mark_dead(conn, dead, schema=schema, now=now))


async def _write_releases(
    conn: Connection, outcomes: Sequence[Outcome], schema: str, now: datetime | None
) -> _Matched:
    leases = [o.lease for o in outcomes]
    return dict.fromkeys(await settling.release_leases(conn, leases, schema=schema, now=now))


# One statement per kind of outcome, written in this order.
_WRITERS: dict[type[Settlement], _Writer] = {
    Sent: _write_sent,
    Retry: _write_retries,
    Dead: _write_dead,
    Release: _write_releases,
}


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
            groups: dict[type[Settlement], list[Outcome]] = {}
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

    async def _write(self, groups: dict[type[Settlement], list[Outcome]]) -> None:
        """One statement per outcome type; a group written is removed from `groups`."""
        async with self._pool.connection() as conn:
            for kind in [k for k in _WRITERS if k in groups]:
                matched = await _WRITERS[kind](conn, groups[kind], self._schema, self._clock())
                outcomes = groups.pop(kind)
                recorded = self._RECORDED[kind]
                for outcome in outcomes:
                    if outcome.message.id in matched:
                        recorded(self, outcome.message, outcome.action, matched[outcome.message.id])
                    elif kind is not Release:
                        self._lost(outcome, kind.__name__.lower())
                    self._on_settled(outcome.message.id)

    def _sent(self, message: ClaimedMessage, action: Sent, latency: float | None) -> None:
        series = self._metrics.kind(message.kind)
        series.sent.inc()
        series.delivery_latency.observe(max(latency or 0.0, 0.0))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "sent",
                extra={
                    **message_fields(message),
                    "provider_message_id": action.provider_message_id,
                },
            )

    def _retried(self, message: ClaimedMessage, action: Retry, _: float | None) -> None:
        self._metrics.retries.labels(message.kind, action.error_class).inc()
        log.info(
            "send failed, retry in %.1fs: %s",
            action.delay_seconds,
            action.error,
            extra={**message_fields(message), "error_class": action.error_class},
        )

    def _dead(self, message: ClaimedMessage, action: Dead, _: float | None) -> None:
        self._metrics.dead_letters.labels(message.kind, action.reason).inc()
        log.warning(
            "dead-lettered (%s): %s",
            action.reason,
            action.error,
            extra={
                **message_fields(message),
                "error_class": action.error_class,
                "reason": action.reason,
            },
        )

    def _released(self, message: ClaimedMessage, _: Release, __: float | None) -> None:
        log.debug("lease released unsent", extra=message_fields(message))

    # What is counted and logged once a row's outcome is in the database, per outcome type.
    _RECORDED: dict[
        type[Settlement], Callable[[CompletionBatcher, ClaimedMessage, Any, float | None], None]
    ] = {Sent: _sent, Retry: _retried, Dead: _dead, Release: _released}

    def _lost(self, outcome: Outcome, what: str) -> None:
        self._metrics.kind(outcome.message.kind).lease_lost.inc()
        log.warning(
            "lease lost before the outcome (%s) was recorded; another worker owns the row",
            what,
            extra=message_fields(outcome.message),
        )
