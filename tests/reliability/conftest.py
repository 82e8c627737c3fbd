"""Fixtures of the reliability suite: the SMTP sink on its own thread, worker processes, and a
database whose server a test may restart."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from leasebox.db.migrations import migrate
from leasebox.testing.embedded import EmbeddedPostgres
from leasebox.testing.ports import free_port
from support.reliability_rig import RestartableDatabase, SmtpServer, SmtpSink, Workers

BUILD = Path(__file__).resolve().parents[2] / "build"


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    server = SmtpServer(SmtpSink(), free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def worker_processes(db_dsn: str, smtp_server: SmtpServer, tmp_path: Path) -> Iterator[Workers]:
    rig = Workers(db_dsn, smtp_server.port, tmp_path)
    try:
        yield rig
    finally:
        rig.kill_all()


@pytest.fixture
def restartable_database(
    request: pytest.FixtureRequest, pg_server: object
) -> Iterator[RestartableDatabase]:
    """The session's embedded server and a fresh database on it; when `LEASEBOX_TEST_DSN`
    names a shared server, which must not be restarted, a server of this test's own."""
    if isinstance(pg_server, EmbeddedPostgres):
        yield RestartableDatabase(pg_server, request.getfixturevalue("db_dsn"))
        return
    server = EmbeddedPostgres(BUILD / f"restart-pg-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    server.start()
    try:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("outbox")))
        dsn = server.dsn_for("outbox")
        migrate(dsn)
        yield RestartableDatabase(server, dsn)
    finally:
        server.destroy()
