"""Settling sent and failed messages in batches, as group commits.

A send's `Completion` (the message and the settlement that ends its lease) is queued here
and the send's slot is free at once; one flusher task takes everything queued, writes it
with at most one statement per kind of settlement (`mark_sent`, `schedule_retry`,
`mark_dead`, `mark_suppressed`, `release_leases`, `mark_superseded`), and while that
statement runs the next batch accumulates. Under load a statement settles dozens
of rows; when idle it settles one with no added delay.

Between the two, a provider that takes a few milliseconds per message (SMTP, a mail API)
finishes its sends one by one, so each statement would settle one or two rows, and the
statement costs the worker more CPU than the send. So while sends are still in flight, a
batch smaller than `LINGER_BELOW` waits for their outcomes, at most `LINGER_SECONDS` (10
ms: an SMTP drain at two thousand sends a second then settles about twenty rows a statement
instead of four, a sixth less CPU per message), and is written as soon as the last of them
arrives, the batch is full, or the worker closes. Ten milliseconds change nothing for a
message already delivered (its `sent_at` is that much later); with nothing in flight nothing
waits.

Each statement matches rows on their lease token, so an id missing from its answer is a
lease this worker lost (it stalled past the lease and another worker reclaimed the row):
that is counted and logged, never retried. A database outage keeps the batch and retries it
with backoff; the statements are idempotent for rows still owned.

Any other error from a statement means one outcome in it cannot be stored (the provider
boundary cleans what providers say, so this is the second line of defence). The batch is
then written outcome by outcome; the one the database refuses is written again without its
provider text (`Sent` without the provider id, a failure with a fixed description), and
only if even that fails is it left to its lease's expiry. Nothing of the sort stops the
flusher or the worker.

An outcome is a fact: once known it is kept until written. While closing, an outcome is
given up only when its lease has run out (the row then belongs to whichever worker reclaims
it), however long the database stays away until then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from psycopg_pool import AsyncConnectionPool

from leasebox.db.connections import DATABASE_ERRORS
from leasebox.runtime.logs import message_fields
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.store import settling
from leasebox.store.claiming import ClaimedMessage, Connection, LeaseRef
from leasebox.store.settling import (
    Dead,
    Release,
    Retry,
    Sent,
    Settlement,
    Superseded,
    Suppressed,
)

log = logging.getLogger("leasebox.worker")

_RETRY_FIRST = 0.1
_RETRY_MAX = 5.0
# How long at most a small batch waits for the outcomes of the sends still in flight, and
# below what size it waits.
LINGER_SECONDS = 0.01
LINGER_BELOW = 32
_A = TypeVar("_A", Sent, Retry, Dead, Suppressed, Release, Superseded)
UNSTORABLE_ERROR = "the failure's description could not be stored"


class Completion(NamedTuple):
    """How one claimed message ended, waiting to be written (one per message sent)."""

    message: ClaimedMessage
    action: Settlement

    @property
    def lease(self) -> LeaseRef:
        return self.action.lease


def _actions(batch: Sequence[Completion], kind: type[_A]) -> list[_A]:
    return [o.action for o in batch if isinstance(o.action, kind)]


# The rows of a batch whose lease still matched, by id (with their latency for `sent`).
_Matched = Mapping[int, float | None]
# Each writer gets the connection, the completions, the schema, `now` and this worker's id.
_Writer = Callable[
    [Connection, Sequence[Completion], str, datetime | None, str | None], Awaitable[_Matched]
]


async def _write_sent(
    conn: Connection, batch: Sequence[Completion], schema: str, now: datetime | None, me: str | None
) -> _Matched:
    sent = _actions(batch, Sent)
    return await settling.mark_sent(conn, sent, schema=schema, now=now, worker_id=me)


async def _write_retries(
    conn: Connection, batch: Sequence[Completion], schema: str, now: datetime | None, me: str | None
) -> _Matched:
    retries = _actions(batch, Retry)
    ids = await settling.schedule_retry(conn, retries, schema=schema, now=now, worker_id=me)
    return dict.fromkeys(ids)


async def _write_dead(
    conn: Connection, batch: Sequence[Completion], schema: str, now: datetime | None, me: str | None
) -> _Matched:
    dead = _actions(batch, Dead)
    return dict.fromkeys(await settling.mark_dead(conn, dead, schema=schema, now=now, worker_id=me))


async def _write_suppressed(
    conn: Connection, batch: Sequence[Completion], schema: str, now: datetime | None, me: str | None
) -> _Matched:
    suppressed = _actions(batch, Suppressed)
    ids = await settling.mark_suppressed(conn, suppressed, schema=schema, now=now, worker_id=me)
    return dict.fromkeys(ids)


async def _write_releases(
    conn: Connection, batch: Sequence[Completion], schema: str, now: datetime | None, me: str | None
) -> _Matched:
    leases = [o.lease for o in batch]
    ids = await settling.release_leases(conn, leases, schema=schema, now=now, worker_id=me)
    return dict.fromkeys(ids)


async def _write_superseded(
    conn: Connection, batch: Sequence[Completion], schema: str, now: datetime | None, me: str | None
) -> _Matched:
    replaced = _actions(batch, Superseded)
    ids = await settling.mark_superseded(conn, replaced, schema=schema, now=now, worker_id=me)
    return dict.fromkeys(ids)


# One statement per kind of outcome, written in this order.
_WRITERS: dict[type[Settlement], _Writer] = {
    Sent: _write_sent,
    Retry: _write_retries,
    Dead: _write_dead,
    Suppressed: _write_suppressed,
    Release: _write_releases,
    Superseded: _write_superseded,
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
        lease_deadline: Callable[[int], float | None] = lambda _: None,
        statement_timeout: float = 30.0,
        worker_id: str | None = None,
        in_flight: Callable[[], int] = lambda: 0,
        linger: float = LINGER_SECONDS,
    ) -> None:
        """`lease_deadline(id)` is the monotonic time the row's lease runs out (None: unknown,
        which counts as run out when closing); `worker_id` names this worker in the history's
        `lease_lost` rows. While `in_flight()` sends are under way, a batch smaller than
        `LINGER_BELOW` waits `linger` seconds for their outcomes before it is written."""
        self._pool = pool
        self._metrics = metrics
        self._schema = schema
        self._clock = clock
        self._on_settled = on_settled
        self._lease_deadline = lease_deadline
        self._timeout = statement_timeout
        self._worker_id = worker_id
        self._in_flight = in_flight
        self._linger = linger
        self._lingering = False
        self._gathered = asyncio.Event()
        self._queue: list[Completion] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.failing: str | None = None
        self.write_failures = 0
        self.given_up = 0

    def put(self, completion: Completion) -> None:
        queue = self._queue
        queue.append(completion)
        if len(queue) == 1:  # the first of a batch: the flusher may be waiting for it
            self._idle.clear()
            self._ready.set()
        if self._lingering and (len(queue) >= LINGER_BELOW or not self._in_flight()):
            self._gathered.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def run(self) -> None:
        """Flush until cancelled, or until `close()` and nothing is left."""
        delay = _RETRY_FIRST
        while True:
            if not self._queue:
                self._idle.set()
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            if len(self._queue) < LINGER_BELOW and not self._closing and self._in_flight():
                await self._gather()
            batch, self._queue = self._queue, []
            unwritten = await self._write_batch(batch)
            if not unwritten:
                if self.failing:
                    log.info("outcomes recorded again: the database is back")
                self.failing = None
                delay = _RETRY_FIRST
                continue
            failure, left = unwritten
            self._queue[:0] = left
            self.failing = f"database unavailable ({type(failure).__name__})"
            self.write_failures += 1
            if self._closing:
                self._give_up(self._out_of_lease())
                if not self._queue:
                    continue
            log.warning(
                "could not record %d outcomes, retrying in %.1fs",
                len(self._queue),
                delay,
                extra={"error_class": type(failure).__name__},
            )
            await asyncio.sleep(delay)
            delay = min(_RETRY_MAX, delay * 2)

    async def _gather(self) -> None:
        """Wait for the outcomes of the sends in flight (see the module's docstring)."""
        self._gathered.clear()
        self._lingering = True
        try:
            async with asyncio.timeout(self._linger):
                await self._gathered.wait()
        except TimeoutError:
            pass
        finally:
            self._lingering = False

    async def close(self) -> None:
        """Write what is queued, then let `run` return.

        Waits as long as the database needs, up to the last held lease's end: an outcome is
        not thrown away while its lease could still be held.
        """
        self._closing = True
        self._ready.set()
        self._gathered.set()
        while not self._idle.is_set():
            deadlines = [self._deadline_of(o) for o in self._queue]
            remaining = max(deadlines, default=0.0) - time.monotonic()
            if self._queue and remaining <= 0:
                self._give_up(list(self._queue))
                return
            try:
                async with asyncio.timeout(max(remaining, _RETRY_FIRST)):
                    await self._idle.wait()
            except TimeoutError:
                continue

    async def _write_batch(
        self, batch: list[Completion]
    ) -> tuple[BaseException, list[Completion]] | None:
        """Write `batch`; None when done, else the outage and the outcomes still to write."""
        groups: dict[type[Settlement], list[Completion]] = {}
        for completion in batch:
            groups.setdefault(type(completion.action), []).append(completion)
        try:
            async with asyncio.timeout(self._timeout):
                await self._write(groups)
        except DATABASE_ERRORS as exc:
            return exc, [o for completions in groups.values() for o in completions]
        except Exception as exc:  # one outcome the database refuses must not stop the others
            left = [o for completions in groups.values() for o in completions]
            return await self._write_one_by_one(left, exc)
        return None

    async def _write_one_by_one(
        self, completions: list[Completion], cause: BaseException
    ) -> tuple[BaseException, list[Completion]] | None:
        log.warning(
            "a batch of %d outcomes was refused (%s); recording them one by one",
            len(completions),
            type(cause).__name__,
        )
        for i, completion in enumerate(completions):
            for attempt in (completion, _without_provider_text(completion)):
                try:
                    async with asyncio.timeout(self._timeout):
                        await self._write({type(attempt.action): [attempt]})
                except DATABASE_ERRORS as exc:
                    return exc, [attempt, *completions[i + 1 :]]
                except Exception as exc:  # this outcome, as given, cannot be stored
                    log.error(
                        "the database refused the outcome (%s) of this message (%s)",
                        type(attempt.action).__name__.lower(),
                        type(exc).__name__,
                        extra=message_fields(attempt.message),
                    )
                    continue
                break
            else:
                log.error(
                    "the outcome of this message cannot be recorded; its lease will expire "
                    "and another attempt follows",
                    extra=message_fields(completion.message),
                )
                self._on_settled(completion.message.id)
        return None

    def _deadline_of(self, completion: Completion) -> float:
        deadline = self._lease_deadline(completion.message.id)
        return float("-inf") if deadline is None else deadline

    def _out_of_lease(self) -> list[Completion]:
        now = time.monotonic()
        return [o for o in self._queue if self._deadline_of(o) <= now]

    def _give_up(self, completions: list[Completion]) -> None:
        """Drop outcomes whose lease ran out while the database was away."""
        if not completions:
            return
        sent = sum(isinstance(o.action, Sent) for o in completions)
        log.error(
            "%d outcomes were not recorded before their leases ran out (%d of them sent); "
            "their rows return to whichever worker reclaims them",
            len(completions),
            sent,
            extra={"count": len(completions)},
        )
        dropped = {id(o) for o in completions}
        self._queue = [o for o in self._queue if id(o) not in dropped]
        self.given_up += len(completions)
        for completion in completions:
            self._on_settled(completion.message.id)
        if not self._queue:
            self._idle.set()

    async def _write(self, groups: dict[type[Settlement], list[Completion]]) -> None:
        """One statement per outcome type; a group written is removed from `groups`."""
        self._metrics.flush()
        async with self._pool.connection() as conn:
            for kind in [k for k in _WRITERS if k in groups]:
                write = _WRITERS[kind]
                matched = await write(
                    conn, groups[kind], self._schema, self._clock(), self._worker_id
                )
                completions = groups.pop(kind)
                if kind is Sent:
                    self._sent(completions, matched)
                    continue
                recorded = self._RECORDED[kind]
                for completion in completions:
                    if completion.message.id in matched:
                        recorded(
                            self,
                            completion.message,
                            completion.action,
                            matched[completion.message.id],
                        )
                    elif kind is not Release:
                        self._lost(completion, kind.__name__.lower())
                    self._on_settled(completion.message.id)

    def _sent(self, completions: Sequence[Completion], matched: _Matched) -> None:
        """Count a batch of sent rows per kind (one `inc`, one bulk observe), mark lost leases."""
        latencies: dict[str, list[float]] = {}
        debug = log.isEnabledFor(logging.DEBUG)
        settled = self._on_settled
        for completion in completions:
            message = completion.message
            if message.id in matched:
                latency = matched[message.id]
                latencies.setdefault(message.kind, []).append(max(latency or 0.0, 0.0))
                if debug:
                    log.debug(
                        "sent",
                        extra={
                            **message_fields(message),
                            "provider_message_id": getattr(
                                completion.action, "provider_message_id", None
                            ),
                        },
                    )
            else:
                self._lost(completion, "sent")
            settled(message.id)
        for kind, values in latencies.items():
            self._metrics.sent_rows(kind, values)

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

    def _suppressed(self, message: ClaimedMessage, action: Suppressed, _: float | None) -> None:
        self._metrics.suppressed_rows([message.kind], action.error_class)
        log.warning(
            "suppressed: the provider refuses the address (%s)",
            action.error_class,
            extra={**message_fields(message), "error_class": action.error_class},
        )

    def _released(self, message: ClaimedMessage, _: Release, __: float | None) -> None:
        log.debug("lease released unsent", extra=message_fields(message))

    def _superseded(self, message: ClaimedMessage, action: Superseded, _: float | None) -> None:
        self._metrics.superseded.labels(message.kind).inc()
        log.info(
            "superseded by outbox id %d before it reached the wire: not sent",
            action.newer,
            extra={**message_fields(message), "superseded_by": action.newer},
        )

    # What is counted and logged once a row's outcome is in the database, per outcome type.
    _RECORDED: dict[
        type[Settlement], Callable[[CompletionBatcher, ClaimedMessage, Any, float | None], None]
    ] = {
        Retry: _retried,
        Dead: _dead,
        Suppressed: _suppressed,
        Release: _released,
        Superseded: _superseded,
    }

    def _lost(self, completion: Completion, what: str) -> None:
        self._metrics.kind(completion.message.kind).lease_lost.inc()
        log.warning(
            "lease lost before the outcome (%s) was recorded; another worker owns the row",
            what,
            extra=message_fields(completion.message),
        )


def _without_provider_text(completion: Completion) -> Completion:
    """The outcome with nothing that came from the provider: what the database can take."""
    action = completion.action
    if isinstance(action, Sent):
        return Completion(completion.message, Sent(action.lease, None))
    if isinstance(action, Retry):
        return Completion(
            completion.message,
            Retry(action.lease, action.delay_seconds, UNSTORABLE_ERROR, "unstorable"),
        )
    if isinstance(action, Dead):
        return Completion(
            completion.message, Dead(action.lease, action.reason, UNSTORABLE_ERROR, None)
        )
    if isinstance(action, Suppressed):
        return Completion(
            completion.message,
            Suppressed(action.lease, UNSTORABLE_ERROR, action.error_class, action.expiry_seconds),
        )
    return completion
