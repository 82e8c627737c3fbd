"""The process around a `Worker`: start-up checks, the connection pool, signals, health server.

Start-up does every check that can fail because of a setting (provider URL, templates, keys,
database reachable and migrated, metrics port free, provider accepting the credentials)
*before* anything is claimed, and turns each failure into one `LeaseboxError` line: a
misconfigured worker exits non-zero without touching a row, instead of crash-looping with
rows in its hands. A provider that cannot be reached yet is not a setting to fix: the worker
serves `/healthz`, says on `/readyz` (and in `leasebox_not_ready`) that it waits for it, and
tries again with a growing pause, claiming nothing until it answers (a `--drain` run, a batch
job, exits instead). Failures after start-up (a database restart, a provider outage) are the
runtime's business: it retries and `/readyz` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo
from psycopg.types.array import ListBinaryDumper
from psycopg_pool import AsyncConnectionPool

from leasebox.config import EVENT_LOOP, METRICS_HOST, METRICS_PORT, PROVIDER_TIMEOUT
from leasebox.db.connections import (
    APPLICATION_NAME,
    CONNECT_TIMEOUT,
    POOL_TIMEOUT,
    connection_error,
    libpq_dsn,
)
from leasebox.db.migrations import expected_schema_version
from leasebox.db.queries import query
from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.providers.base import Provider
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    NotMigrated,
    ProviderError,
    ProviderUnavailable,
)
from leasebox.messages import register_lazy_json
from leasebox.producer.payload_crypto import default_cipher
from leasebox.runtime.health import HealthServer, build_app
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.tracing import DeliveryTracing, provider_from_environment
from leasebox.runtime.worker import Worker

log = logging.getLogger("leasebox.worker")
# The pauses between tries to start a provider that cannot be reached, growing from the first.
PROVIDER_RETRY_FIRST = 1.0
PROVIDER_RETRY_MAX = 30.0
PROVIDER_START = "provider_start"


@dataclass(frozen=True)
class ProcessConfig:
    """What a worker process needs beyond `WorkerSettings`: where things are.

    The defaults are the settings table's (`leasebox.config`). metrics_port: 0 turns the
    HTTP server off.
    """

    settings: WorkerSettings
    dsn: str
    provider_url: str = field(repr=False)
    templates_dir: Path | None = None
    provider_timeout: float = PROVIDER_TIMEOUT.default
    metrics_host: str = METRICS_HOST.default
    metrics_port: int = METRICS_PORT.default
    event_loop: str = EVENT_LOOP.default
    """`auto`, `uvloop` or `asyncio` (`leasebox.runtime.event_loops`); `serve` runs on
    whatever loop it is given and only reports which."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dsn", libpq_dsn(self.dsn))  # SQLAlchemy's spellings too


async def serve(config: ProcessConfig, metrics: WorkerMetrics | None = None) -> int:
    """Run one worker process until SIGTERM (or drained); returns the exit code."""
    settings = config.settings
    traces = provider_from_environment(os.environ)
    provider = provider_from_url(config.provider_url, timeout=config.provider_timeout)
    renderer = TemplateRenderer(config.templates_dir)
    cipher = default_cipher()
    newer = await check_database(config.dsn, settings.schema)
    if newer:
        log.warning(newer)
    if settings.drain:  # a batch job: nothing to wait for
        await start_provider(provider)
    pool = AsyncConnectionPool(
        config.dsn,
        min_size=2,
        max_size=4,
        open=False,
        timeout=POOL_TIMEOUT,
        name="leasebox-worker",
        configure=_configure,
        kwargs={
            "autocommit": True,
            "application_name": f"{APPLICATION_NAME}-worker",
            "connect_timeout": CONNECT_TIMEOUT,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
        },
    )
    health: HealthServer | None = None
    try:
        await _open_pool(pool, config.dsn)
        worker = Worker(
            settings,
            pool,
            provider,
            renderer,
            dsn=config.dsn,
            cipher=cipher,
            metrics=metrics,
            tracing=None
            if traces is None
            else DeliveryTracing(traces, provider_name=provider.name, worker_id=settings.worker_id),
        )
        if newer:
            worker.notes.append(newer)
        if config.metrics_port:
            health = HealthServer(
                build_app(worker.metrics, worker.readiness_problem, details=worker.status_lines),
                config.metrics_host,
                config.metrics_port,
            )
            await health.start()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, worker.request_stop)
        try:
            if settings.drain or await wait_for_provider(provider, worker):
                await worker.run()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        return 1 if worker.failed else 0
    finally:
        if health is not None:
            await health.stop()
        await pool.close()
        await provider.close()
        if traces is not None:
            traces.shutdown()


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # A claimed row's `data` is decoded only if the provider reads content.
    register_lazy_json(conn)
    # The settling statements pass their batches as arrays: in the binary format, psycopg
    # packs each element instead of quoting it as text (a regex per element).
    conn.adapters.register_dumper(list, ListBinaryDumper)
    # The worker's statements are prepared once and run thousands of times with parameters
    # that never change their best plan; left to choose, PostgreSQL plans some of them anew
    # for each run (a partitioned table makes a custom plan look cheaper than it is).
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    # Timestamps come back in UTC, which psycopg loads several times faster than in a named
    # zone (a claim loads four per row). The same instants: the worker only compares them and
    # adds seconds to them, and its statements count time in seconds, never in days.
    await conn.execute("SET TIME ZONE 'UTC'")


async def check_database(dsn: str, schema: str) -> str | None:
    """Connect once and check the schema: `DatabaseUnavailable` or `NotMigrated` if not; what
    to say about a schema newer than this worker (None when it is the same)."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=f"{APPLICATION_NAME}-worker",
        )
    except psycopg.OperationalError as exc:
        raise connection_error(dsn, exc) from None
    except psycopg.ProgrammingError:
        raise ConfigurationError(
            "the DSN cannot be parsed; expected postgresql://user@host/db"
        ) from None
    async with conn:
        cur = await conn.execute(query("schema_present", schema), {"schema_name": schema})
        row = await cur.fetchone()
        if not row or not row[0]:
            raise NotMigrated(schema)
        try:
            cur = await conn.execute(query("schema_version", schema))
            found = await cur.fetchone()
        except psycopg.errors.UndefinedTable:
            raise NotMigrated(schema, "it has no migration history") from None
    applied, needed = int(found[0] if found else 0), expected_schema_version()
    if applied < needed:  # claiming on an older schema could miss columns this image writes
        raise NotMigrated(schema, f"it is at version {applied}, this image needs {needed}")
    if applied > needed:
        # A newer release migrated it (a rollout under way, or this worker left behind): it
        # runs on, since migrations add what older workers ignore, and says so.
        return (
            f"schema {schema!r} is at version {applied}, newer than this worker's {needed}: "
            "a newer release migrated it; upgrade this worker to that release"
        )
    return None


async def start_provider(provider: Provider) -> None:
    """Open the provider's connections, or one line saying why it cannot."""
    try:
        await provider.start()
    except ProviderError as exc:
        await provider.close()
        raise ProviderUnavailable(f"cannot start the {provider.name} provider: {exc}") from None


async def wait_for_provider(provider: Provider, worker: Worker) -> bool:
    """Start `provider`, trying again with a growing pause while it cannot be reached, the
    worker not ready meanwhile; False if a stop came first. A provider that refuses the
    worker's settings (credentials, TLS) is `ProviderUnavailable` at once: no retry fixes it."""
    pause = PROVIDER_RETRY_FIRST
    tries = 0
    while True:
        try:
            await provider.start()
        except ProviderError as exc:
            await provider.close()
            reason = f"cannot start the {provider.name} provider: {exc}"
            if not exc.transient:
                raise ProviderUnavailable(reason) from None
            tries += 1
            if tries == 1 or tries % 10 == 0:
                log.warning(
                    "waiting for the provider: %s; trying again, claiming nothing meanwhile",
                    reason,
                    extra={"error_class": exc.code, "attempt": tries},
                )
            worker.block(PROVIDER_START, f"provider: {reason} (trying again)")
            if await worker.until_stopped(pause * (0.5 + random.random() / 2)):
                return False
            pause = min(pause * 2, PROVIDER_RETRY_MAX)
            continue
        if tries:
            log.info("the provider answers: starting to claim", extra={"attempt": tries + 1})
        worker.unblock(PROVIDER_START)
        return True


async def _open_pool(pool: AsyncConnectionPool[Any], dsn: str) -> None:
    try:
        await pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2)
    except Exception as exc:  # the pool wraps what went wrong; the reason is one line
        raise DatabaseUnavailable(
            f"cannot open the connection pool: {type(exc).__name__}"
        ) from None


def secret_values(config: ProcessConfig, environ: Mapping[str, str]) -> list[str]:
    """Values no log line may show: passwords, API keys, payload keys (masked if seen).

    The provider's keys include those it reads from the environment or a file by default
    (`SENDGRID_API_KEY`, `AWS_SECRET_ACCESS_KEY`, ...), not only those in its URL.
    """
    from leasebox.delivery.providers.registry import credential_values
    from leasebox.producer.payload_crypto import keys_from_environment

    values: list[str] = []
    with contextlib.suppress(psycopg.ProgrammingError):
        password = conninfo.conninfo_to_dict(config.dsn).get("password")
        if password:
            values.append(str(password))
    values.extend(credential_values(config.provider_url, environ))
    values.extend(keys_from_environment(environ))
    return values
