"""Running `leasebox web`: check the schema, open the connection pool, serve until stopped.

The schema is checked once at start-up (it must hold the audit table of migration 0008), so
a server on an old schema says so in one line instead of failing its first action. The pool
is small: a page load holds one connection for a few statements.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web
from psycopg_pool import ConnectionPool

from leasebox.db.connections import APPLICATION_NAME, check_migrated, connect
from leasebox.errors import NotMigrated
from leasebox.web.app import build_app
from leasebox.web.settings import WebSettings

log = logging.getLogger("leasebox.web")
POOL_SIZE = 4


def check_schema(settings: WebSettings) -> None:
    """Raise `NotMigrated` (or `DatabaseUnavailable`) unless the schema has the audit table."""
    with connect(settings.dsn, autocommit=True) as conn:
        check_migrated(conn, settings.schema)
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{settings.schema}".audit',)
        ).fetchone()
    if not row or not row[0]:
        raise NotMigrated(settings.schema, "it has no audit table (migration 0008)")


@contextmanager
def connection_pool(settings: WebSettings) -> Iterator[ConnectionPool[Any]]:
    pool: ConnectionPool[Any] = ConnectionPool(
        settings.dsn,
        min_size=1,
        max_size=POOL_SIZE,
        kwargs={"application_name": f"{APPLICATION_NAME} web", "connect_timeout": 5},
        timeout=10,
        open=False,
    )
    pool.open(wait=False)
    try:
        yield pool
    finally:
        pool.close()


def describe(settings: WebSettings) -> str:
    mode = "actions allowed" if settings.allow_actions else "read-only"
    return f"http://{settings.host}:{settings.port}/ (auth {settings.auth}, {mode})"


def serve(settings: WebSettings) -> int:
    """Serve until SIGINT or SIGTERM; returns the exit status."""
    check_schema(settings)
    with connection_pool(settings) as pool:
        app = build_app(settings, pool)
        print(f"leasebox web: serving {describe(settings)}", file=sys.stderr, flush=True)
        web.run_app(app, host=settings.host, port=settings.port, print=None, access_log=None)
    return 0
