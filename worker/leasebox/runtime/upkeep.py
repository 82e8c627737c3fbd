"""The worker's chores for everyone: sweeps, partitions, and waking up when rows arrive.

A worker's sends are only half its job. Leases other workers left behind when they died
must be reclaimed (or their rows would wait forever); OTPs that outlived their TTL must be
dead-lettered (never sent late); the coming days need their partitions before their rows
arrive; and an idle worker should wake when rows arrive rather than at its next poll. Each
sweep is one cheap, batched statement (`leasebox.store.sweeps`); the partition maintenance
(`leasebox.db.partitions`), and with a retention the dropping of the days past it
(`leasebox.store.pruning`), runs hourly on a short-lived connection of its own, in a thread,
since it is DDL that may wait briefly for a lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox.db.connections import STATEMENT_TIMEOUT, connect
from leasebox.db.partitions import ensure_partitions
from leasebox.db.queries import query
from leasebox.errors import LeaseboxError
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.runtime.settings import WorkerSettings
from leasebox.states import DeadReason, Status
from leasebox.store import quotas, sweeps
from leasebox.store.pruning import PruneResult, prune

log = logging.getLogger("leasebox.worker")

SWEEP_LIMIT = 500
_LISTEN_RETRY_MAX = 5.0
# How often the partitions of the coming days are checked (and the days past the retention
# dropped), and how soon that is retried after a failure.
PARTITION_INTERVAL = 3600.0
PARTITION_RETRY = 300.0


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
            reclaimed = await sweeps.reclaim_expired_leases(
                conn,
                limit=SWEEP_LIMIT,
                default_max_attempts=settings.max_attempts,
                schema=settings.schema,
                now=clock(),
            )
            expired = await sweeps.dead_letter_expired(
                conn, limit=SWEEP_LIMIT, schema=settings.schema, now=clock()
            )
        for row in reclaimed:
            metrics.kind(row.kind).leases_reclaimed.inc()
            if row.status is Status.DEAD:
                metrics.dead_letters.labels(row.kind, DeadReason.ATTEMPTS_EXHAUSTED).inc()
            log.info(
                "reclaimed an expired lease (%s)",
                row.status,
                extra={"outbox_id": row.id, "kind": row.kind},
            )
        for gone in expired:
            metrics.dead_letters.labels(gone.kind, DeadReason.EXPIRED).inc()
            log.warning(
                "dead-lettered (expired): not sent before its expiry",
                extra={"outbox_id": gone.id, "kind": gone.kind, "reason": DeadReason.EXPIRED},
            )
        touched += len(reclaimed) + len(expired)
        if len(reclaimed) < SWEEP_LIMIT and len(expired) < SWEEP_LIMIT:
            return touched


async def listen_for_rows(
    dsn: str,
    schema: str,
    wake: asyncio.Event,
    quota_paused: Callable[[str, float], None] | None = None,
) -> None:
    """Set `wake` whenever rows are inserted into `schema`'s outbox, and tell `quota_paused`
    (account, until) of a provider account's pause; reconnects forever.

    The trigger notifies once per INSERT statement with the schema as payload, so one
    channel serves every schema on the server; a pause says `<schema>:quota:...`.
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
                    elif quota_paused is not None:
                        paused = quotas.pause_notice(notify.payload, schema)
                        if paused is not None:
                            quota_paused(*paused)
        except (psycopg.Error, OSError) as exc:
            failures += 1
            if failures == 1:
                log.warning(
                    "NOTIFY listener lost its connection; polling meanwhile",
                    extra={"error_class": type(exc).__name__},
                )
            await asyncio.sleep(min(_LISTEN_RETRY_MAX, 0.5 * failures))


def maintain_days(dsn: str, schema: str, retention_seconds: float | None) -> PruneResult | None:
    """Create the partitions of the coming days and, given a retention, drop the days past
    it (what `leasebox prune` does); what retention dropped, or None without one.

    A partition that cannot be made does not stop retention: the result's `problem` says
    what was not made (without a retention, `PartitionsIncomplete` does)."""
    with connect(dsn, autocommit=True) as conn:
        if retention_seconds is None:
            created = ensure_partitions(conn, schema)
            if created:
                log.info("created %d partitions for the coming days", len(created))
            return None
        return prune(conn, retention_seconds=retention_seconds, schema=schema)


async def keep_days(dsn: str, schema: str, retention_seconds: float | None = None) -> None:
    """`maintain_days` hourly, forever; a failure is logged and retried sooner.

    Every worker of a schema does this: `prune` serialises them (the first drops a day, the
    others find nothing left to drop), so no worker has to be elected for it.
    """
    failures = 0
    while True:
        try:
            pruned = await asyncio.to_thread(maintain_days, dsn, schema, retention_seconds)
        except (psycopg.Error, OSError, LeaseboxError) as exc:
            failures += 1
            if failures == 1 or failures % 12 == 0:
                log.warning(
                    "could not maintain the day partitions (%s): rows of a day without one "
                    "wait in the default partition until it exists, and days past the "
                    "retention stay until a later run drops them",
                    type(exc).__name__,
                    extra={"error_class": type(exc).__name__},
                )
            await asyncio.sleep(PARTITION_RETRY)
            continue
        if pruned is not None and pruned.partitions:
            log.info(
                "retention dropped %d day partitions: %d sent messages, %d expired receipts; "
                "kept %d messages of those days that are not sent, dead or named by a live "
                "receipt",
                len(pruned.partitions),
                pruned.sent,
                pruned.receipts,
                pruned.kept,
            )
        if pruned is not None and pruned.problem:
            log.warning("retention ran, but %s", pruned.problem)
            await asyncio.sleep(PARTITION_RETRY)
            continue
        failures = 0
        await asyncio.sleep(PARTITION_INTERVAL)
