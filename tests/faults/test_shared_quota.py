"""A provider account's quota holds across worker processes, measured where it matters: by
the provider stand-in's clock.

1, 4 and 16 `leasebox worker` processes share one account's quota (25 messages a second,
burst 1) through the database and send into a loopback SMTP sink, which stamps each message
as it arrives. Once all are up and each has sent a first message (its connection is open),
a backlog is enqueued and drained, and its stamps are judged.

The database hands out the backlog's tokens due one spacing (1/rate) apart (the reservations
are proved exact in tests/db/test_quota_reservations.py), and a worker writes a message no
earlier than its token is due. The sink sees each message later, by however long the send
took to reach it: on two shared cores running sixteen workers, from milliseconds to a stall
of a few hundred. So, judged by the sink's clock, the i-th arrival comes no sooner than i
spacings after the first, less the first one's own delay, which the test allows up to
`FIRST_DELAY` (a quarter of a second: a few times what it is on an idle machine); a quota that
let 5 % too many through would be further ahead than that by the end of the drain. The rate
(the slope of the arrivals over time) must be within 10 % of the quota; its accuracy (within
5 %) is measured over longer runs by `make bench`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from leasebox import OutboxMessage, enqueue_many
from leasebox.testing.smtp_sink import SmtpSink
from support.waiting import wait_for

pytestmark = pytest.mark.slow

RATE = 25.0
MESSAGES = 150
ACCOUNT = "shared-test-account"
TOLERANCE = 0.10
FIRST_DELAY = 0.25


def seed(dsn: str, count: int, prefix: str) -> None:
    with psycopg.connect(dsn) as conn:
        enqueue_many(
            conn,
            [
                OutboxMessage(
                    kind="verification",
                    recipient=f"{prefix}{i}@example.com",
                    data={"link": f"https://example.com/v/{i}"},
                )
                for i in range(count)
            ],
        )


@contextlib.contextmanager
def workers(dsn: str, url: str, processes: int, directory: Path) -> Iterator[list[Path]]:
    """`processes` workers sharing the quota, all started (their logs say so) before the
    block runs, so that the drain is measured without the processes' start-up; stopped by
    SIGTERM after it."""
    environment = {**os.environ, "LEASEBOX_DSN": dsn}
    command = [
        sys.executable, "-m", "leasebox", "worker", "--provider", url, "--kinds",
        "verification", "--quota", f"{RATE:g}/s", "--quota-burst", "1", "--quota-account",
        ACCOUNT, "--metrics-port", "0", "--concurrency", "4", "--log-format", "json",
    ]  # fmt: skip
    logs = [directory / f"w{n}.log" for n in range(processes)]
    started = []
    try:
        for n, log in enumerate(logs):
            with log.open("wb") as out:
                started.append(
                    subprocess.Popen(
                        [*command, "--worker-id", f"w{n}"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=environment,
                    )
                )
        wait_for(
            lambda: all('"worker started"' in log.read_text(errors="replace") for log in logs),
            what=f"{processes} workers to start",
            timeout=120,
        )
        yield logs
        for process in started:
            process.send_signal(signal.SIGTERM)
        for process in started:
            assert process.wait(timeout=60) == 0
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def most_ahead(stamps: list[float]) -> float:
    """How far (seconds) the furthest arrival came before `i / rate` after the first."""
    return max(stamps[0] + i / RATE - stamp for i, stamp in enumerate(stamps))


@pytest.mark.parametrize("processes", [1, 4, 16])
def test_the_accounts_rate_holds_however_many_workers_share_it(
    db_dsn: str, tmp_path: Path, processes: int
) -> None:
    with SmtpSink(clock=time.monotonic) as sink, workers(db_dsn, sink.url, processes, tmp_path):
        warm = 2 * processes
        seed(db_dsn, warm, "warm")
        wait_for(lambda: len(sink.received) >= warm, what="the first sends", timeout=60)
        seed(db_dsn, MESSAGES, "u")
        wait_for(
            lambda: len(sink.received) >= warm + MESSAGES, what="the backlog drained", timeout=60
        )
        stamps = sorted(m.received_at for m in sink.received if m.recipient.startswith("u"))

    assert len(stamps) == MESSAGES
    ahead = most_ahead(stamps)
    assert ahead <= FIRST_DELAY, f"an arrival came {ahead:.3f}s ahead of the quota's pace"
    rate = statistics.linear_regression(stamps, range(len(stamps))).slope
    assert abs(rate / RATE - 1) <= TOLERANCE, rate
    with psycopg.connect(db_dsn) as conn:
        account = conn.execute(
            "SELECT rate, burst FROM leasebox.quotas WHERE account = %s", (ACCOUNT,)
        ).fetchone()
    assert account == (RATE, 1)
