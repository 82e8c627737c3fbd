"""Fixtures of the reliability suite: the SMTP sink on its own thread, and worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from leasebox.testing.embedded import free_port
from support.reliability_rig import SmtpServer, SmtpSink, Workers


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
