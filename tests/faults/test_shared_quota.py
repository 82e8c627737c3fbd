"""A provider account's quota holds across worker processes, measured where it matters: by
the provider stand-in's clock.

1, 4 and 16 `leasebox worker` processes share one account's quota (25 messages a second,
burst 1) through the database; once all of them are up, a backlog is enqueued and drained
into a loopback SMTP sink, which stamps each message as it arrives. The guarantee is the
bound: in any stretch of w seconds at most `rate * w + burst` messages go out. The sink
stamps a message when its DATA ends, after the network and the SMTP exchange, whose time
varies by a few milliseconds from message to message, so one message more than the bound may
show in a stretch: the test allows that one and nothing else. The rate over the whole drain
is checked against the quota from below with a tolerance sized for a four-second drain on two
shared cores that other tests use at the same time, where a worker woken late sends late
(never early); the accuracy itself (within 5 %) is measured by `make bench` over longer runs.
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
MESSAGES = 100
ACCOUNT = "shared-test-account"
# How far below the quota a four-second drain may come on a busy test machine (a worker woken
# late sends late); above it, only the bound's one message of stamping jitter is allowed.
SHORTFALL = 0.15


def seed(dsn: str, count: int) -> None:
    with psycopg.connect(dsn) as conn:
        enqueue_many(
            conn,
            [
                OutboxMessage(
                    kind="verification",
                    recipient=f"u{i}@example.com",
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
        ACCOUNT, "--metrics-port", "0", "--poll-interval", "0.1", "--log-format", "json",
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


def most_in_a_stretch(stamps: list[float]) -> float:
    """The largest excess, over all stretches between two arrivals, of the messages that
    arrived in the stretch over what the quota allows in it (`rate * w + burst`)."""
    worst = -float("inf")
    for i, start in enumerate(stamps):
        for j in range(i, len(stamps)):
            allowed = RATE * (stamps[j] - start) + 1
            worst = max(worst, (j - i + 1) - allowed)
    return worst


@pytest.mark.parametrize("processes", [1, 4, 16])
def test_the_accounts_rate_holds_however_many_workers_share_it(
    db_dsn: str, tmp_path: Path, processes: int
) -> None:
    with SmtpSink(clock=time.monotonic) as sink, workers(db_dsn, sink.url, processes, tmp_path):
        seed(db_dsn, MESSAGES)
        wait_for(lambda: len(sink.received) >= MESSAGES, what="the backlog drained", timeout=60)
        stamps = sorted(message.received_at for message in sink.received)

    assert len(stamps) == MESSAGES
    excess = most_in_a_stretch(stamps)
    assert excess <= 1, f"{excess:.2f} messages over the quota in one stretch"
    measured = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    assert measured >= RATE * (1 - SHORTFALL), measured
    with psycopg.connect(db_dsn) as conn:
        account = conn.execute(
            "SELECT rate, burst FROM leasebox.quotas WHERE account = %s", (ACCOUNT,)
        ).fetchone()
    assert account == (RATE, 1)
