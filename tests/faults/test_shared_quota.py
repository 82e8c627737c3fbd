"""A provider account's quota holds across worker processes, measured where it matters: by
the provider stand-in's clock.

1, 4 and 16 `leasebox worker` processes share one account's quota (25 messages a second,
burst 1) through the database and send into a loopback SMTP sink, which stamps each message
as it arrives. Once all are up and each has sent a first message (its connection is open),
a backlog is enqueued and drained, and its stamps are judged.

The database hands out the backlog's tokens due one spacing (1/rate) apart (the reservations
are proved exact in tests/store/test_quota_reservations.py), and a worker writes a message no
earlier than its token is due. With a burst of 1, by any moment t after the backlog was
committed at t0 at most 1 + rate * (t - t0) of its messages may have been sent: the i-th
arrival (from 0) comes no sooner than t0 + i / rate, by the sink's wall clock, which is the
database's and the workers'. A loaded machine only delays sends, so the bound holds however
slow the machine; a quota that let one message too many through breaks it. That the drain
keeps up with the quota (its accuracy within 5 %) is a matter of speed, measured over longer
runs by `make bench`; here the drain must merely reach half the quota's rate.
"""

from __future__ import annotations

import contextlib
import os
import signal
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
# Clock reading and rounding between the database, the workers and the sink.
CLOCK_SLACK = 0.01


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


def most_ahead(stamps: list[float], committed: float) -> float:
    """How far (seconds) the furthest arrival came before `committed + i / rate`."""
    return max(committed + i / RATE - stamp for i, stamp in enumerate(stamps))


@pytest.mark.parametrize("processes", [1, 4, 16])
def test_the_accounts_rate_holds_however_many_workers_share_it(
    db_dsn: str, tmp_path: Path, processes: int
) -> None:
    with SmtpSink(clock=time.time) as sink, workers(db_dsn, sink.url, processes, tmp_path):
        warm = 2 * processes
        seed(db_dsn, warm, "warm")
        wait_for(lambda: len(sink.received) >= warm, what="the first sends", timeout=60)
        committed = time.time()  # no later than the commit: the bound only gets looser
        seed(db_dsn, MESSAGES, "u")
        wait_for(
            lambda: len(sink.received) >= warm + MESSAGES, what="the backlog drained", timeout=60
        )
        stamps = sorted(m.received_at for m in sink.received if m.recipient.startswith("u"))

    assert len(stamps) == MESSAGES
    ahead = most_ahead(stamps, committed)
    assert ahead <= CLOCK_SLACK, f"an arrival came {ahead:.3f}s ahead of the quota's pace"
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    assert rate >= RATE / 2, f"the drain ran at {rate:.1f}/s"
    with psycopg.connect(db_dsn) as conn:
        account = conn.execute(
            "SELECT rate, burst FROM leasebox.quotas WHERE account = %s", (ACCOUNT,)
        ).fetchone()
    assert account == (RATE, 1)
