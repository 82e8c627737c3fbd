"""Fixtures of the fault-injection suite, and the table it prints: per scenario, the copies the
server took per message and the messages' final states."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.producer.payload_crypto import PayloadCipher, generate_key
from support.fault_rig import VERDICTS


@pytest.fixture
def cipher() -> PayloadCipher:
    """The codes of a scenario are encrypted at rest, as in production."""
    return PayloadCipher([generate_key()])


@pytest.fixture
async def db_pool(db_dsn: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(
        db_dsn, min_size=1, max_size=4, timeout=5, kwargs={"autocommit": True}
    ) as opened:
        yield opened


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not VERDICTS:
        return
    header = ("scenario", "copies taken per message", "final states")
    table = [header, *(v.row() for v in VERDICTS)]
    widths = [max(len(r[i]) for r in table) for i in range(3)]
    terminalreporter.section("fault scenarios: what the server took, how the rows ended")
    for row in table:
        terminalreporter.write_line(
            " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        )
