"""The operator's backlog reads against a real PostgreSQL: shared pools, bounded queries."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from leasebox.db.migrations import expected_schema_version
from leasebox.store.backlog import fetch_backlog_async
from leasebox_operator import database
from leasebox_operator.database import ConnectionPools, DatabaseBacklogSource
from leasebox_operator.errors import PollError, SecretError
from leasebox_operator.models import PoolSpec
from leasebox_operator.settings import OperatorSettings
from support.orm_producers import sqlalchemy_url
from support.outbox_rows import insert_backlog

SPEC = PoolSpec.model_validate({
    "kinds": ["otp"], "database": {"secretRef": {"name": "db"}},
    "provider": {"secretRef": {"name": "mail"}},
})  # fmt: skip


class SecretStore:
    """Stands in for the API's Secrets."""

    def __init__(self, values: dict[tuple[str, str], str]) -> None:
        self.values = values
        self.reads = 0

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        self.reads += 1
        if (name, key) not in self.values:
            raise SecretError(f"Secret {namespace}/{name} does not exist", "SecretNotFound")
        return self.values[(name, key)]


@pytest.fixture
async def pools() -> AsyncIterator[ConnectionPools]:
    shared = ConnectionPools(
        OperatorSettings(statement_timeout_seconds=0.3, connect_timeout_seconds=1)
    )
    yield shared
    await shared.close()


def _insert(conn: psycopg.Connection[Any], count: int) -> None:
    insert_backlog(conn, count)
    conn.commit()


async def test_pools_sharing_a_database_share_one_connection_pool(
    pools: ConnectionPools, db_conn: psycopg.Connection[Any], db_dsn: str
) -> None:
    _insert(db_conn, 5)
    store = SecretStore({("db", "dsn"): db_dsn})
    first = DatabaseBacklogSource(store, "mail", pools)
    second = DatabaseBacklogSource(store, "other", pools)
    assert (await first.fetch(SPEC, 5.0)).pending == 5
    assert (await second.fetch(SPEC, 5.0)).ready == 5
    await first.fetch(SPEC, 5.0)
    assert len(pools._pools) == 1
    assert store.reads == 2  # the DSN is cached between polls


async def test_pools_polling_together_share_one_backlog_query_and_keep_their_own_figures(
    pools: ConnectionPools,
    db_conn: psycopg.Connection[Any],
    db_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queries: list[list[str]] = []

    async def counted(conn: Any, kinds: list[str], **options: Any) -> Any:
        queries.append(list(kinds))
        return await fetch_backlog_async(conn, kinds, **options)

    monkeypatch.setattr(database, "fetch_backlog_async", counted)
    insert_backlog(db_conn, 3, kind="otp")
    insert_backlog(db_conn, 2, kind="invite")
    db_conn.commit()
    store = SecretStore({("db", "dsn"): db_dsn})
    invites = PoolSpec.model_validate(SPEC.model_dump(by_alias=True) | {"kinds": ["invite"]})
    otp, invite = await asyncio.gather(
        DatabaseBacklogSource(store, "mail", pools).fetch(SPEC, 5.0),
        DatabaseBacklogSource(store, "other", pools).fetch(invites, 5.0),
    )
    assert [(k.kind, k.pending) for k in otp.kinds] == [("otp", 3)]
    assert [(k.kind, k.pending) for k in invite.kinds] == [("invite", 2)]
    assert otp.observed_at == invite.observed_at
    assert queries == [["otp", "invite"]]


async def test_the_pools_connections_run_the_backlog_on_its_generic_plan(
    pools: ConnectionPools, db_dsn: str
) -> None:
    await pools.backlog(db_dsn, ["otp"], "leasebox", 5.0)
    pool = pools._pools[db_dsn]
    async with pool.connection() as conn:
        cur = await conn.execute("SHOW plan_cache_mode")
        assert await cur.fetchone() == ("force_generic_plan",)


async def test_a_blocked_backlog_query_hits_the_statement_timeout(
    pools: ConnectionPools, db_conn: psycopg.Connection[Any], db_dsn: str
) -> None:
    db_conn.execute("LOCK TABLE leasebox.queue IN ACCESS EXCLUSIVE MODE")
    try:
        with pytest.raises(PollError) as caught:
            await pools.backlog(db_dsn, ["otp"], "leasebox", 5.0)
    finally:
        db_conn.rollback()
    assert caught.value.reason == "QueryTimeout"
    assert "0.3s statement timeout" in caught.value.message


async def test_an_unmigrated_schema_says_how_to_fix_it(pools: ConnectionPools, db_dsn: str) -> None:
    with pytest.raises(PollError) as caught:
        await pools.backlog(db_dsn, ["otp"], "elsewhere", 5.0)
    assert caught.value.reason == "SchemaMissing"
    assert "leasebox migrate --schema elsewhere" in caught.value.message


async def test_an_unreachable_database_is_reported_without_its_password(
    pools: ConnectionPools, db_dsn: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    params = conninfo.conninfo_to_dict(db_dsn) | {"port": port, "password": "hunter2-secret"}
    dsn = conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
    with pytest.raises(PollError) as caught:
        await pools.backlog(dsn, ["otp"], "leasebox", 5.0)
    assert caught.value.reason == "ConnectionFailed"
    assert f"127.0.0.1:{port}" in caught.value.message
    assert "hunter2" not in caught.value.message


async def test_a_missing_secret_or_a_malformed_dsn_is_a_poll_error(
    pools: ConnectionPools,
) -> None:
    missing = DatabaseBacklogSource(SecretStore({}), "mail", pools)
    with pytest.raises(PollError) as caught:
        await missing.fetch(SPEC, 5.0)
    assert (caught.value.reason, caught.value.message) == (
        "SecretNotFound", "Secret mail/db does not exist")  # fmt: skip
    garbled = SecretStore({("db", "dsn"): "host=db password=s3cret port"})
    source = DatabaseBacklogSource(garbled, "mail", pools)
    with pytest.raises(PollError) as caught:
        await source.fetch(SPEC, 5.0)
    assert caught.value.reason == "InvalidDSN"
    assert "s3cret" not in caught.value.message


async def test_the_schema_is_missing_outdated_or_current_with_the_fix_in_the_message(
    pools: ConnectionPools, empty_db_dsn: str, db_dsn: str
) -> None:
    manual = PoolSpec.model_validate(
        SPEC.model_dump(by_alias=True) | {"database": {"secretRef": {"name": "db"},
                                                       "migrations": "Manual"}}
    )  # fmt: skip
    empty = DatabaseBacklogSource(SecretStore({("db", "dsn"): empty_db_dsn}), "mail", pools)
    missing = await empty.check_schema(manual)
    assert missing is not None
    assert missing.reason == "SchemaMissing"
    assert "run `leasebox migrate --schema leasebox`" in missing.message

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM leasebox.schema_migrations WHERE version = %s",
                     (expected_schema_version(),))  # fmt: skip
    source = DatabaseBacklogSource(SecretStore({("db", "dsn"): db_dsn}), "mail", pools)
    outdated = await source.check_schema(SPEC)
    assert outdated is not None
    assert outdated.reason == "SchemaOutdated"
    assert f"this release needs {expected_schema_version()}" in outdated.message
    assert "init container" in outdated.message  # migrations: Auto

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO leasebox.schema_migrations (version, name) VALUES (%s, 'x')",
                     (expected_schema_version(),))  # fmt: skip
    assert await source.check_schema(SPEC) is None
    assert await source.check_schema(SPEC) is None  # cached: no second query for a minute


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_a_secret_holding_a_sqlalchemy_url_is_read_as_its_dsn(
    pools: ConnectionPools, db_conn: psycopg.Connection[Any], db_dsn: str, driver: str
) -> None:
    _insert(db_conn, 3)
    store = SecretStore({("db", "dsn"): sqlalchemy_url(db_dsn, driver)})
    assert (await DatabaseBacklogSource(store, "mail", pools).fetch(SPEC, 5.0)).pending == 3


async def test_a_pooled_connection_the_server_dropped_costs_no_failed_poll(
    pools: ConnectionPools, db_conn: psycopg.Connection[Any], db_dsn: str
) -> None:
    _insert(db_conn, 2)
    source = DatabaseBacklogSource(SecretStore({("db", "dsn"): db_dsn}), "mail", pools)
    assert (await source.fetch(SPEC, 5.0)).pending == 2  # its connection waits in the pool
    # A restart, a failover or a proxy's idle timeout closes it while it is idle.
    ended = db_conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = 'leasebox-operator' AND pid <> pg_backend_pid()"
    ).fetchone()
    db_conn.commit()
    assert ended is not None
    assert ended[0] >= 1
    assert (await source.fetch(SPEC, 5.0)).pending == 2


async def test_pools_on_one_database_share_its_schema_check(
    pools: ConnectionPools, db_dsn: str
) -> None:
    store = SecretStore({("db", "dsn"): db_dsn})
    first = DatabaseBacklogSource(store, "mail", pools)
    assert await first.check_schema(SPEC) is None
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM leasebox.schema_migrations WHERE version = %s",
                     (expected_schema_version(),))  # fmt: skip
    # Another pool on the same database and schema relies on the check of a moment ago.
    assert await DatabaseBacklogSource(store, "other", pools).check_schema(SPEC) is None
    # On another schema it asks the database itself.
    elsewhere = PoolSpec.model_validate(
        SPEC.model_dump(by_alias=True)
        | {"database": {"secretRef": {"name": "db"}, "schema": "elsewhere"}}
    )
    missing = await DatabaseBacklogSource(store, "third", pools).check_schema(elsewhere)
    assert missing is not None
    assert missing.reason == "SchemaMissing"
