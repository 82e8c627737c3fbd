"""Keeping leases honest around the sends: extension, reclaim, expiry, and wake-ups.

A worker's sends are only half its job. Leases it holds must be extended while a slow send
runs (or another worker would take the row and send it again); leases other workers left
behind when they died must be reclaimed (or their rows would wait forever); OTPs that
outlived their TTL must be dead-lettered (never sent late); and an idle worker should wake
when rows arrive rather than at its next poll. Each is one cheap, batched statement here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox import claiming
from leasebox.claiming import ClaimedMessage, LeaseRef
from leasebox.metrics import WorkerMetrics
from leasebox.queries import query
from leasebox.retrying import REASON_ATTEMPTS_EXHAUSTED, REASON_EXPIRED
from leasebox.worker_settings import WorkerSettings

log = logging.getLogger("leasebox.worker")

STATEMENT_TIMEOUT = 30.0
SWEEP_LIMIT = 500
_LISTEN_RETRY_MAX = 5.0


@dataclass
class Held:
    """A claimed row this worker still holds, with its lease deadline on the local clock.

    The deadline is counted from before the claim was sent, so it never ends later than the
    lease in the database does.
    """

    message: ClaimedMessage
    claimed_at: float
    deadline: float
    lost: bool = False
    lease: LeaseRef = field(init=False)

    def __post_init__(self) -> None:
        self.lease = LeaseRef(self.message.id, self.message.lease_token)


def message_fields(message: ClaimedMessage) -> dict[str, object]:
    """The log fields that identify a message (never its recipient or content)."""
    return {
        "outbox_id": message.id,
        "aggregate_id": message.aggregate_id,
        "kind": message.kind,
        "attempt": message.attempts,
    }


async def extend_due_leases(
    pool: AsyncConnectionPool,
    held: Mapping[int, Held],
    settings: WorkerSettings,
    now: datetime | None,
) -> None:
    """Extend, in one statement, every held lease with less than half its time left.

    A lease that cannot be extended is lost (the row was reclaimed): it is marked so that a
    row still waiting for a send slot is not sent.
    """
    started = time.monotonic()
    due = [
        h for h in held.values() if not h.lost and h.deadline - started < settings.lease_seconds / 2
    ]
    if not due:
        return
    async with asyncio.timeout(STATEMENT_TIMEOUT), pool.connection() as conn:
        kept = await claiming.extend_leases(
            conn,
            [h.lease for h in due],
            lease_seconds=settings.lease_seconds,
            schema=settings.schema,
            now=now,
        )
    for entry in due:
        if entry.message.id in kept:
            entry.deadline = started + settings.lease_seconds
        elif entry.message.id in held:
            entry.lost = True
            log.warning("lease could not be extended: lost", extra=message_fields(entry.message))


async def sweep(
    pool: AsyncConnectionPool,
    settings: WorkerSettings,
    metrics: WorkerMetrics,
    clock: Callable[[], datetime | None],
) -> int:
    """Reclaim expired leases and dead-letter expired OTPs; returns rows touched."""
    touched = 0
    while True:
        async with asyncio.timeout(STATEMENT_TIMEOUT), pool.connection() as conn:
            reclaimed = await claiming.reclaim_expired_leases(
                conn,
                limit=SWEEP_LIMIT,
                default_max_attempts=settings.max_attempts,
                schema=settings.schema,
                now=clock(),
            )
            expired = await claiming.dead_letter_expired(
                conn, limit=SWEEP_LIMIT, schema=settings.schema, now=clock()
            )
        for row in reclaimed:
            metrics.kind(row.kind).leases_reclaimed.inc()
            if row.status == "dead":
                metrics.dead_letters.labels(row.kind, REASON_ATTEMPTS_EXHAUSTED).inc()
            log.info(
                "reclaimed an expired lease (%s)",
                row.status,
                extra={"outbox_id": row.id, "kind": row.kind},
            )
        for outbox_id, kind in expired:
            metrics.dead_letters.labels(kind, REASON_EXPIRED).inc()
            log.warning(
                "dead-lettered (expired): not sent before its expiry",
                extra={"outbox_id": outbox_id, "kind": kind, "reason": REASON_EXPIRED},
            )
        touched += len(reclaimed) + len(expired)
        if len(reclaimed) < SWEEP_LIMIT and len(expired) < SWEEP_LIMIT:
            return touched


async def listen_for_rows(dsn: str, schema: str, wake: asyncio.Event) -> None:
    """Set `wake` whenever rows are inserted into `schema`'s outbox; reconnects forever.

    The trigger notifies once per INSERT statement with the schema as payload, so one
    channel serves every schema on the server.
    """
    failures = 0
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, application_name="leasebox-worker-listen", connect_timeout=5
            )
            async with conn:
                await conn.execute(query("listen", schema))
                failures = 0
                wake.set()  # notifications may have been missed while away
                async for notify in conn.notifies():
                    if notify.payload == schema:
                        wake.set()
        except (psycopg.Error, OSError) as exc:
            failures += 1
            if failures == 1:
                log.warning(
                    "NOTIFY listener lost its connection; polling meanwhile",
                    extra={"error_class": type(exc).__name__},
                )
            await asyncio.sleep(min(_LISTEN_RETRY_MAX, 0.5 * failures))
