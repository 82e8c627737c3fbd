"""The operator's database side: shared connection pools and each pool's backlog source.

Every OutboxWorkerPool polls every few seconds, and many pools usually share one
database, so the operator keeps one small psycopg pool per DSN rather than a connection
per resource. Connections run in autocommit with a server-side statement timeout, so a
slow database costs one bounded query, never a stuck poll loop or an idle transaction.
The DSN is read from the pool's Secret through the API and lives only in memory; every
error that leaves this module is a `PollError` with a reason and a password-free message.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from leasebox.db.connections import connection_error
from leasebox.errors import NotMigrated
from leasebox.store.backlog import Backlog, fetch_backlog_async
from leasebox_operator.kube import Kube, SecretError
from leasebox_operator.models import PoolSpec
from leasebox_operator.polling import PollError
from leasebox_operator.settings import OperatorSettings

APPLICATION_NAME = "leasebox-operator"
SECRET_TTL_SECONDS = 60.0


class ConnectionPools:
    """One connection pool per DSN, shared by every OutboxWorkerPool that uses it."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._pools: dict[str, AsyncConnectionPool[Any]] = {}

    async def _pool(self, dsn: str) -> AsyncConnectionPool[Any]:
        pool = self._pools.get(dsn)
        if pool is None:
            timeout_ms = int(self.settings.statement_timeout_seconds * 1000)
            pool = AsyncConnectionPool(
                dsn,
                min_size=0,
                max_size=self.settings.pool_max_connections,
                kwargs={
                    "autocommit": True,
                    "connect_timeout": max(1, round(self.settings.connect_timeout_seconds)),
                    "application_name": APPLICATION_NAME,
                    "options": f"-c statement_timeout={timeout_ms}",
                },
                check=AsyncConnectionPool.check_connection,
                timeout=self.settings.connect_timeout_seconds,
                open=False,
                name=APPLICATION_NAME,
            )
            await pool.open(wait=False)
            self._pools[dsn] = pool
        return pool

    async def backlog(
        self, dsn: str, kinds: list[str], schema: str, window_seconds: float
    ) -> Backlog:
        """The backlog in one round trip, or `PollError`."""
        pool = await self._pool(dsn)
        try:
            async with pool.connection() as conn:
                return await fetch_backlog_async(
                    conn, kinds, schema=schema, window_seconds=window_seconds
                )
        except PoolTimeout:
            raise await self._diagnose(dsn) from None
        except psycopg.errors.QueryCanceled:
            raise PollError(
                "QueryTimeout",
                f"the backlog query exceeded the {self.settings.statement_timeout_seconds:g}s "
                "statement timeout",
            ) from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            raise PollError("SchemaMissing", str(NotMigrated(schema))) from None
        except psycopg.OperationalError as exc:
            raise PollError("ConnectionFailed", str(connection_error(dsn, exc))) from None
        except psycopg.Error as exc:
            raise PollError(
                "QueryFailed",
                f"the backlog query failed: {type(exc).__name__} "
                f"(SQLSTATE {exc.sqlstate or 'unknown'})",
            ) from None

    async def _diagnose(self, dsn: str) -> PollError:
        """Why the pool has no connection: one direct attempt names the real cause."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                dsn,
                connect_timeout=max(1, round(self.settings.connect_timeout_seconds)),
                application_name=APPLICATION_NAME,
            )
        except psycopg.Error as exc:
            return PollError("ConnectionFailed", str(connection_error(dsn, exc)))
        await conn.close()
        return PollError(
            "ConnectionFailed",
            f"no database connection within {self.settings.connect_timeout_seconds:g}s",
        )

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()


class DatabaseBacklogSource:
    """One pool's backlog: DSN from its Secret (cached briefly), query via the shared pools."""

    def __init__(self, kube: Kube, namespace: str, pools: ConnectionPools) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pools = pools
        self._dsn: str | None = None
        self._ref: tuple[str, str] | None = None
        self._read_at = 0.0

    async def _resolve(self, spec: PoolSpec) -> str:
        ref = (spec.database.secret_ref.name, spec.database.secret_ref.key)
        fresh = time.monotonic() - self._read_at < SECRET_TTL_SECONDS
        if self._dsn is not None and self._ref == ref and fresh:
            return self._dsn
        try:
            dsn = await self.kube.secret_value(self.namespace, *ref)
        except SecretError as exc:
            raise PollError(exc.reason, exc.message) from None
        try:
            conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError:
            raise PollError(
                "InvalidDSN",
                f"key {ref[1]!r} of Secret {self.namespace}/{ref[0]} is not a PostgreSQL DSN",
            ) from None
        self._dsn, self._ref, self._read_at = dsn.strip(), ref, time.monotonic()
        return self._dsn

    async def fetch(self, spec: PoolSpec, window_seconds: float) -> Backlog:
        dsn = await self._resolve(spec)
        try:
            return await self.pools.backlog(
                dsn, list(spec.kinds), spec.database.schema_name, window_seconds
            )
        except PollError:
            self._dsn = None  # a rotated Secret is picked up on the next try
            raise
