"""The operator's database side: shared connection pools and each pool's backlog source.

Every OutboxWorkerPool polls every few seconds, and many pools usually share one
database, so the operator keeps one small psycopg pool per DSN rather than a connection
per resource. Connections run in autocommit with a server-side statement timeout, so a
slow database costs one bounded query, never a stuck poll loop or an idle transaction.
The DSN is read from the pool's Secret through the API and lives only in memory; every
error that leaves this module is a `PollError` with a reason and a password-free message.
The schema's migration version is checked against this release's on the first poll and
then once a minute per database and schema (every poll while it is wrong), so SchemaMissing
and SchemaOutdated cost no query on the hot path, however many pools share the schema.

A pooled connection is handed out without a check (a round trip of its own on every poll);
one the server closed while it sat idle fails its first statement instead, and that query is
run once more on a fresh connection (`ConnectionPools._run`), so it costs no failed poll.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from leasebox.db.connections import connection_error, libpq_dsn
from leasebox.db.migrations import expected_schema_version
from leasebox.db.queries import query
from leasebox.errors import ConfigurationError, NotMigrated
from leasebox.store.backlog import GENERIC_PLANS, Backlog, fetch_backlog_async
from leasebox.store.reputation import Verdict, fetch_reputation_async, judge
from leasebox_operator.backlog_gathering import BacklogGatherer
from leasebox_operator.errors import PollError, PoolProblem, SecretError
from leasebox_operator.models import PoolSpec
from leasebox_operator.settings import OperatorSettings

APPLICATION_NAME = "leasebox-operator"
# A DSN that fails is read again at the next poll; one that works changes only by rotation.
SECRET_TTL_SECONDS = 300.0
SCHEMA_RECHECK_SECONDS = 60.0
# The reputation rates move over hours: read them every few minutes, not every poll.
REPUTATION_SECONDS = 300.0

T = TypeVar("T")
Connection = psycopg.AsyncConnection[Any]


class ConnectionPools:
    """One connection pool per DSN, shared by every OutboxWorkerPool that uses it."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._pools: dict[str, AsyncConnectionPool[Any]] = {}
        self._current: dict[tuple[str, str], float] = {}  # (DSN, schema): found current at
        self._gatherer = BacklogGatherer(self._backlog, settings.backlog_gather_seconds)

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
                    "options": f"-c statement_timeout={timeout_ms} {GENERIC_PLANS}",
                },
                timeout=self.settings.connect_timeout_seconds,
                open=False,
                name=APPLICATION_NAME,
            )
            await pool.open(wait=False)
            self._pools[dsn] = pool
        return pool

    async def _run(self, dsn: str, work: Callable[[Connection], Awaitable[T]]) -> T:
        """`work` on a pooled connection, once more on a fresh one if the server dropped it.

        Only a connection that is broken after the error (the server closed it) earns the
        second try; a timeout, a missing table or a full pool is the database's answer.
        """
        pool = await self._pool(dsn)
        retried = False
        while True:
            conn: Connection | None = None
            try:
                async with pool.connection() as conn:
                    return await work(conn)
            except psycopg.OperationalError:
                if retried or conn is None or not conn.broken:
                    raise
                retried = True

    def recently_current(self, dsn: str, schema: str) -> bool:
        """Whether `schema` was found at this release's migration within the last minute."""
        found = self._current.get((dsn, schema))
        return found is not None and time.monotonic() - found < SCHEMA_RECHECK_SECONDS

    def found_current(self, dsn: str, schema: str, current: bool) -> None:
        """Record a schema check: a current schema is not checked again for a minute."""
        if current:
            self._current[(dsn, schema)] = time.monotonic()
        else:
            self._current.pop((dsn, schema), None)

    async def backlog(
        self, dsn: str, kinds: list[str], schema: str, window_seconds: float
    ) -> Backlog:
        """The backlog of `kinds`, read with the other pools' reads of the gathering
        window in one round trip (see `backlog_gathering`), or `PollError`."""
        return await self._gatherer.backlog(dsn, kinds, schema, window_seconds)

    async def _backlog(
        self, dsn: str, kinds: list[str], schema: str, window_seconds: float
    ) -> Backlog:
        """The backlog in one round trip, or `PollError`."""

        async def work(conn: Connection) -> Backlog:
            return await fetch_backlog_async(
                conn, kinds, schema=schema, window_seconds=window_seconds
            )

        try:
            return await self._run(dsn, work)
        except PoolTimeout:
            raise await self._diagnose(dsn) from None
        except psycopg.errors.QueryCanceled:
            raise PollError(
                f"the backlog query exceeded the {self.settings.statement_timeout_seconds:g}s "
                "statement timeout",
                "QueryTimeout",
            ) from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            raise PollError(str(NotMigrated(schema)), "SchemaMissing") from None
        except psycopg.OperationalError as exc:
            raise PollError(str(connection_error(dsn, exc)), "ConnectionFailed") from None
        except psycopg.Error as exc:
            raise PollError(
                f"the backlog query failed: {type(exc).__name__} "
                f"(SQLSTATE {exc.sqlstate or 'unknown'})",
                "QueryFailed",
            ) from None

    async def reputation(self, dsn: str, kinds: list[str], schema: str) -> Verdict:
        """The reputation of the providers that sent `kinds`, or `PollError`."""

        async def work(conn: Connection) -> Verdict:
            return judge(await fetch_reputation_async(conn, kinds, schema=schema))

        try:
            return await self._run(dsn, work)
        except PoolTimeout:
            raise await self._diagnose(dsn) from None
        except psycopg.Error as exc:
            raise PollError(
                f"the reputation query failed: {type(exc).__name__}", "QueryFailed"
            ) from None

    async def schema_version(self, dsn: str, schema: str) -> int | None:
        """The newest migration applied to `schema`, or None when it does not exist."""

        async def work(conn: Connection) -> tuple[Any, ...] | None:
            return await (await conn.execute(query("schema_version", schema))).fetchone()

        try:
            row = await self._run(dsn, work)
        except PoolTimeout:
            raise await self._diagnose(dsn) from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return None
        except psycopg.OperationalError as exc:
            raise PollError(str(connection_error(dsn, exc)), "ConnectionFailed") from None
        return int(row[0]) if row else 0

    async def _diagnose(self, dsn: str) -> PollError:
        """Why the pool has no connection: one direct attempt names the real cause."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                dsn,
                connect_timeout=max(1, round(self.settings.connect_timeout_seconds)),
                application_name=APPLICATION_NAME,
            )
        except psycopg.Error as exc:
            return PollError(str(connection_error(dsn, exc)), "ConnectionFailed")
        await conn.close()
        return PollError(
            f"no database connection within {self.settings.connect_timeout_seconds:g}s",
            "ConnectionFailed",
        )

    async def close(self) -> None:
        await self._gatherer.close()
        pools, self._pools, self._current = list(self._pools.values()), {}, {}
        for pool in pools:
            await pool.close()


class SecretReader(Protocol):
    """Where the DSN comes from (`kube.Kube` reads it from the pool's Secret)."""

    async def secret_value(self, namespace: str, name: str, key: str) -> str: ...


class DatabaseBacklogSource:
    """One pool's backlog: DSN from its Secret (cached briefly), query via the shared pools."""

    def __init__(self, kube: SecretReader, namespace: str, pools: ConnectionPools) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pools = pools
        self._dsn: str | None = None
        self._ref: tuple[str, str] | None = None
        self._read_at = 0.0
        self._reputation_read_at: float | None = None

    async def _resolve(self, spec: PoolSpec) -> str:
        ref = (spec.database.secret_ref.name, spec.database.secret_ref.key)
        fresh = time.monotonic() - self._read_at < SECRET_TTL_SECONDS
        if self._dsn is not None and self._ref == ref and fresh:
            return self._dsn
        try:
            dsn = await self.kube.secret_value(self.namespace, *ref)
        except SecretError as exc:
            raise PollError(exc.message, exc.reason) from None
        try:
            dsn = libpq_dsn(dsn)  # SQLAlchemy's spellings, as in an application's DATABASE_URL
            conninfo.conninfo_to_dict(dsn)
        except (psycopg.ProgrammingError, ConfigurationError):
            raise PollError(
                f"key {ref[1]!r} of Secret {self.namespace}/{ref[0]} is not a PostgreSQL DSN",
                "InvalidDSN",
            ) from None
        self._dsn, self._ref, self._read_at = dsn.strip(), ref, time.monotonic()
        return self._dsn

    async def check_schema(self, spec: PoolSpec) -> PoolProblem | None:
        """SchemaMissing or SchemaOutdated (with the fix in the message), or None."""
        dsn = await self._resolve(spec)
        schema = spec.database.schema_name
        if self.pools.recently_current(dsn, schema):
            return None
        try:
            applied = await self.pools.schema_version(dsn, schema)
        except PollError:
            self._dsn = None
            raise
        needed = expected_schema_version()
        problem = schema_problem(schema, applied, needed, spec.database.migrations)
        self.pools.found_current(dsn, schema, problem is None)
        return problem

    async def reputation(self, spec: PoolSpec) -> Verdict | None:
        """The reputation condition, read at most every `REPUTATION_SECONDS` (None between
        reads, and when it cannot be read: it never fails a poll)."""
        read = self._reputation_read_at
        if read is not None and time.monotonic() - read < REPUTATION_SECONDS:
            return None
        self._reputation_read_at = time.monotonic()
        try:
            dsn = await self._resolve(spec)
            return await self.pools.reputation(dsn, list(spec.kinds), spec.database.schema_name)
        except PollError:
            return None

    async def fetch(self, spec: PoolSpec, window_seconds: float) -> Backlog:
        dsn = await self._resolve(spec)
        try:
            return await self.pools.backlog(
                dsn, list(spec.kinds), spec.database.schema_name, window_seconds
            )
        except PollError:
            self._dsn = None  # a rotated Secret is picked up on the next try
            raise


def schema_problem(schema: str, applied: int | None, needed: int, mode: str) -> PoolProblem | None:
    """What a schema at migration `applied` (None: absent) means for a pool, with the fix."""
    if applied is not None and applied >= needed:
        return None
    fix = (
        "the workers' migrate init container applies the migrations when a worker starts"
        if mode == "Auto"
        else f"run `leasebox migrate --schema {schema}` against the pool's database, or set "
        "spec.database.migrations: Auto"
    )
    if applied is None:
        return PoolProblem(f"the leasebox schema {schema!r} does not exist; {fix}", "SchemaMissing")
    return PoolProblem(
        f"the leasebox schema {schema!r} is at migration {applied}, this release needs "
        f"{needed}; {fix}",
        "SchemaOutdated",
    )
