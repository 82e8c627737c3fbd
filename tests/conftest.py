"""Shared fixtures: a real PostgreSQL for every database test.

`LEASEBOX_TEST_DSN` selects an existing server; otherwise an embedded PostgreSQL starts once
per session with its data under `build/`. The leasebox schema is migrated once into a
template database, and each test gets a fresh copy of it. Under `CI` a database that cannot
be had fails the test instead of skipping it.

Fixtures are named by what they are, with one prefix per kind of thing, in every directory:
`db_*` for a database and what is bound to it (`db_dsn`, `db_conn`, `db_aconn`, `db_pool`,
`db_now`, `db_insert`), `fake_*` for a test double (`fake_provider`, `fake_clock`), and
`<protocol>_server` for a real server on loopback (`smtp_server`, `smtp_starttls_server`,
`postfix_server`).
The rigs they are built from live in `support/`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psycopg
import pytest
import uvloop
from psycopg import conninfo, sql

from leasebox.db.migrations import migrate

pytest_plugins = ["support.cluster.fixtures", "support.postfix_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
TEMPLATE_DB = f"leasebox_template_{os.getpid()}"
# The providers' own tests run on both loops a worker may choose (`--event-loop`): that is
# where the loops differ (the SMTP provider takes over each connection's transport, and
# uvloop's transports are not asyncio's classes). Everything else runs on asyncio's loop.
BOTH_LOOPS = frozenset(
    {
        "test_smtp_provider.py",
        "test_smtp_pipelining.py",
        "test_smtp_against_postfix.py",
        "test_hostile_smtp.py",
        "test_http_provider.py",
        "test_http_readiness_and_replies.py",
        "test_hostile_http.py",
        "test_mail_services.py",
    }
)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    del config
    if item.path.name in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


def _with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"database required under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """The embedded server when no LEASEBOX_TEST_DSN is set (None otherwise)."""
    if os.environ.get("LEASEBOX_TEST_DSN"):
        yield None
        return
    from leasebox.testing.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(BUILD / f"test-pg-{os.getpid()}")
    try:
        server.start()
    except Exception as exc:  # the reason matters more than the type here
        _unavailable(f"embedded PostgreSQL did not start: {exc}")
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def server_dsn(pg_server: object) -> str:
    """DSN of the server's maintenance database."""
    explicit = os.environ.get("LEASEBOX_TEST_DSN")
    if explicit:
        try:
            psycopg.connect(explicit, connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            _unavailable(f"LEASEBOX_TEST_DSN is not reachable: {exc}")
        return explicit
    from leasebox.testing.embedded import EmbeddedPostgres

    assert isinstance(pg_server, EmbeddedPostgres)
    return pg_server.dsn


@pytest.fixture(scope="session")
def template_dsn(server_dsn: str) -> Iterator[str]:
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(TEMPLATE_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
    dsn = _with_dbname(server_dsn, TEMPLATE_DB)
    migrate(dsn)
    yield dsn
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE_DB))
        )


def create_database(server_dsn: str, template: str | None = None) -> str:
    """Create an empty (or template-copied) database; return its DSN."""
    name = f"leasebox_test_{uuid.uuid4().hex[:12]}"
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(statement)
    return _with_dbname(server_dsn, name)


def drop_database(server_dsn: str, dsn: str) -> None:
    name = conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


@pytest.fixture
def empty_db_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database with nothing in it (for migration tests)."""
    dsn = create_database(server_dsn)
    yield dsn
    drop_database(server_dsn, dsn)


@pytest.fixture
def other_empty_db_dsn(server_dsn: str) -> Iterator[str]:
    """A second fresh, empty database, for tests that build two schemas side by side."""
    dsn = create_database(server_dsn)
    yield dsn
    drop_database(server_dsn, dsn)


@pytest.fixture
def db_dsn(server_dsn: str, template_dsn: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    dsn = create_database(server_dsn, TEMPLATE_DB)
    yield dsn
    drop_database(server_dsn, dsn)


@pytest.fixture
def db_conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    """A connection to the test's database; tests commit explicitly."""
    with psycopg.connect(db_dsn) as conn:
        yield conn


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    db_fixtures = {"server_dsn", "db_dsn", "db_conn", "empty_db_dsn", "template_dsn"}
    for item in items:
        if db_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.db)
