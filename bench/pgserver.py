"""One PostgreSQL server for a whole benchmark run, and a fresh database per measurement.

Every system in a comparison runs against the same server in the same run, each in a
database of its own, so that no system inherits another's bloat, statistics or caches.
By default the server is leasebox's embedded PostgreSQL under `build/bench-pg`; an existing
server can be given instead (the smoke test passes the test suite's server).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
from psycopg import conninfo, sql

from leasebox.db.migrations import migrate

DEFAULT_DATA_DIR = Path("build/bench-pg")


def with_dbname(dsn: str, dbname: str) -> str:
    """`dsn` pointing at database `dbname` on the same server."""
    params = conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def as_url(dsn: str) -> str:
    """A `postgresql://` URL for `dsn`, the form every peer (Node.js included) understands.

    A Unix-socket host (a directory) cannot stand in the URL's authority, where it would
    swallow the database name; it goes in the `host` query parameter instead, which libpq,
    asyncpg and node-postgres all read.
    """
    params = conninfo.conninfo_to_dict(dsn)
    user = quote(str(params.get("user", "postgres")), safe="")
    password = f":{quote(str(params['password']), safe='')}" if params.get("password") else ""
    host = str(params.get("host") or "127.0.0.1")
    port = str(params.get("port") or 5432)
    dbname = quote(str(params.get("dbname", "postgres")), safe="")
    if host.startswith("/"):
        query = urlencode({"host": host, "port": port}, safe="/")
        return f"postgresql://{user}{password}@/{dbname}?{query}"
    authority = f"[{host}]" if ":" in host else host
    return f"postgresql://{user}{password}@{authority}:{port}/{dbname}"


class BenchServer:
    """The server every benchmark of a run shares; creates and drops databases on it."""

    def __init__(self, server_dsn: str) -> None:
        self.server_dsn = server_dsn
        self._created: list[str] = []

    def create_database(self, label: str, *, leasebox_schema: bool) -> str:
        """A new, empty database (with the leasebox schema migrated if asked); its URL."""
        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._created.append(name)
        dsn = as_url(with_dbname(self.server_dsn, name))
        if leasebox_schema:
            migrate(dsn)
        return dsn

    def drop_database(self, dsn: str) -> None:
        name = str(conninfo.conninfo_to_dict(dsn)["dbname"])
        with psycopg.connect(self.server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if name in self._created:
            self._created.remove(name)

    def drop_all(self) -> None:
        for name in list(self._created):
            self.drop_database(with_dbname(self.server_dsn, name))

    @contextlib.contextmanager
    def database(self, label: str, *, leasebox_schema: bool) -> Iterator[str]:
        dsn = self.create_database(label, leasebox_schema=leasebox_schema)
        try:
            yield dsn
        finally:
            self.drop_database(dsn)

    def describe(self) -> dict[str, str]:
        """Version and the settings that matter for queue throughput."""
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "shared_buffers",
            "max_connections",
            "full_page_writes",
        )
        with psycopg.connect(self.server_dsn) as conn:
            rows = conn.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)", (list(names),)
            ).fetchall()
        found = {str(n): f"{s}{'' if u in (None, '') else ' x ' + str(u)}" for n, s, u in rows}
        return {name: found.get(name, "?") for name in names}


@contextlib.contextmanager
def bench_server(
    server_dsn: str | None, data_dir: Path = DEFAULT_DATA_DIR
) -> Iterator[BenchServer]:
    """The given server, or an embedded one started for the run and stopped after it."""
    if server_dsn:
        server = BenchServer(server_dsn)
        try:
            yield server
        finally:
            server.drop_all()
        return
    from leasebox.testing.embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres(data_dir)
    with contextlib.suppress(RuntimeError):  # a run killed earlier may have left it running
        embedded.stop("immediate")
    embedded.start()
    server = BenchServer(embedded.dsn)
    try:
        yield server
    finally:
        try:
            server.drop_all()
        finally:
            embedded.stop()
