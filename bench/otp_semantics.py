"""Two benchmarks of OTP send semantics: a shared provider quota's accuracy, and an OTP's
latency behind a verification backlog.

**Quota accuracy.** 1, 4 and 16 `leasebox worker` processes share one account's quota
(`--quota`, burst 1) and send into a loopback SMTP sink (`leasebox.testing.smtp_sink`) that
stamps every message on its own clock as it arrives. Once all are up and each has sent a
first message (its connection open), a backlog is enqueued; the rate is the slope of the
arrivals over time (a least-squares fit, so that neither end's delay decides it), judged
against the quota: within 5 % is the target. `ahead` is how far the furthest arrival came
before its place at the quota's pace after the first (what over-sending would show).

**OTP behind a backlog.** One worker (`null://`, LISTEN on) with `--priorities` drains a
backlog of verification messages while OTPs arrive at a steady rate; each OTP's latency is
`sent_at - created_at` on the database's clock, over the OTPs enqueued while at least a
tenth of the backlog was still waiting. The same run without priorities (first in, first
out) is the yardstick: there an OTP waits for the backlog ahead of it. The target is the
latency benchmark's: p99 under 10 ms.

`created_at` is the start of the producer's transaction, so an OTP's latency holds three
parts, each reported as p50 and p99: the producer's own transaction (`BEGIN` to `COMMIT`
returned, on the benchmark's clock; nothing can claim the OTP before it commits), from
`created_at` to the start of the claim that took it, and from that claim to its `sent` row.
They say where a miss comes from: the producer, the worker's claims, or its sends.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.accounting import percentile
from bench.pgserver import BenchServer
from bench.systems import ROOT, leasebox_command
from leasebox.messages import OutboxMessage
from leasebox.producer.batch import enqueue_many
from leasebox.producer.enqueue import enqueue
from leasebox.testing.smtp_sink import SmtpSink

ACCOUNT = "bench-account"
START_TIMEOUT = 120.0
SEED_CHUNK = 10_000


@contextmanager
def _workers(dsn: str, label: str, count: int, args: Sequence[str]) -> Iterator[list[Path]]:
    """`count` worker processes with `args`, started (their logs say so); SIGTERM after."""
    logs = [ROOT / "build" / f"bench-{label}-{n}.log" for n in range(count)]
    logs[0].parent.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen[bytes]] = []
    environment = {**os.environ, "LEASEBOX_DSN": dsn}
    try:
        for n, log in enumerate(logs):
            command = [*leasebox_command(), "worker", "--worker-id", f"{label}-{n}", *args]
            with log.open("wb") as out:
                started.append(
                    subprocess.Popen(
                        command, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=ROOT
                    )
                )
        deadline = time.monotonic() + START_TIMEOUT
        while not all("worker started" in log.read_text(errors="replace") for log in logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                raise RuntimeError(f"the {label} workers did not start (see {logs[0]})")
            time.sleep(0.1)
        yield logs
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _seed(dsn: str, kind: str, count: int, prefix: str) -> None:
    with psycopg.connect(dsn) as conn:
        for start in range(0, count, SEED_CHUNK):
            enqueue_many(
                conn,
                [
                    OutboxMessage(
                        kind=kind,
                        recipient=f"{prefix}{i}@example.com",
                        data={"link": f"https://example.com/v/{i}", "minutes_valid": 10},
                        secrets={"code": "123456"} if kind == "otp" else {},
                    )
                    for i in range(start, min(count, start + SEED_CHUNK))
                ],
            )
            conn.commit()


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass(frozen=True)
class QuotaResult:
    workers: int
    quota_per_second: float
    messages: int
    received: int
    rate_per_second: float | None
    ahead_seconds: float | None
    error: str = ""

    @property
    def accuracy(self) -> float | None:
        """The measured rate over the quota (1.0 is exact)."""
        return (
            None if self.rate_per_second is None else self.rate_per_second / self.quota_per_second
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "quota_per_second": self.quota_per_second,
            "messages": self.messages,
            "received": self.received,
            "rate_per_second": _round(self.rate_per_second, 3),
            "accuracy": _round(self.accuracy, 4),
            "ahead_seconds": _round(self.ahead_seconds, 3),
            "error": self.error,
        }


def run_quota_case(server: BenchServer, workers: int, rate: float, seconds: float) -> QuotaResult:
    messages = int(rate * seconds)
    args = [
        "--kinds", "verification", "--quota", f"{rate:g}/s", "--quota-burst", "1",
        "--quota-account", ACCOUNT, "--concurrency", "4", "--metrics-port", "0",
        "--log-format", "json", "--log-level", "info",
    ]  # fmt: skip
    try:
        with (
            server.database("quota", leasebox_schema=True) as dsn,
            SmtpSink(clock=time.monotonic) as sink,
            _workers(dsn, f"quota{workers}", workers, ["--provider", sink.url, *args]),
        ):
            warm = 2 * workers
            _seed(dsn, "verification", warm, "warm")
            _wait(lambda: len(sink.received) >= warm, 60, "the first sends")
            _seed(dsn, "verification", messages, "u")
            _wait(lambda: len(sink.received) >= warm + messages, seconds * 3 + 30, "the drain")
            stamps = sorted(m.received_at for m in sink.received if m.recipient.startswith("u"))
    except RuntimeError as exc:
        return QuotaResult(workers, rate, messages, 0, None, None, str(exc))
    slope = statistics.linear_regression(stamps, range(len(stamps))).slope
    ahead = max(stamps[0] + i / rate - stamp for i, stamp in enumerate(stamps))
    error = "" if len(stamps) == messages else f"{len(stamps)} of {messages} arrived"
    return QuotaResult(workers, rate, messages, len(stamps), slope, ahead, error)


def run_quota(
    server: BenchServer, workers: Sequence[int], rate: float, seconds: float
) -> list[QuotaResult]:
    return [run_quota_case(server, n, rate, seconds) for n in workers]


@dataclass(frozen=True)
class BacklogLatencyResult:
    priorities: bool
    backlog: int
    otps: int
    behind: int
    sent: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    error: str = ""
    # The parts of the latency (see the module's docstring), each its (p50, p99) in ms.
    parts: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "priorities": self.priorities,
            "backlog": self.backlog,
            "otps": self.otps,
            "otps_behind_the_backlog": self.behind,
            "sent": self.sent,
            "p50_ms": _round(self.p50_ms, 2),
            "p99_ms": _round(self.p99_ms, 2),
            "max_ms": _round(self.max_ms, 2),
            "error": self.error,
        }
        for part, (p50, p99) in self.parts.items():
            found[f"{part}_p50_ms"] = _round(p50, 2)
            found[f"{part}_p99_ms"] = _round(p99, 2)
        return found


# The OTPs enqueued while at least a tenth of the backlog was still waiting (a verification
# not yet sent when the OTP was created counts: the sends are counted by their index), each
# with its latency and the start of the claim that took it (its first), in seconds.
OTPS_BEHIND = """
SELECT m.id, extract(epoch FROM m.sent_at - m.created_at)::float8 AS latency,
       extract(epoch FROM c.at - m.created_at)::float8 AS to_claim,
       extract(epoch FROM m.sent_at - c.at)::float8 AS claim_to_sent
FROM leasebox.messages AS m
LEFT JOIN LATERAL (
    SELECT min(h.at) AS at FROM leasebox.history AS h
    WHERE h.outbox_id = m.id AND h.event = 'claimed'
) AS c ON true
WHERE m.kind = 'otp'
  AND %(backlog)s - (SELECT count(*) FROM leasebox.history AS h
                     WHERE h.event = 'sent' AND h.kind = 'verification'
                       AND h.at <= m.created_at) >= %(backlog)s / 10
"""


def run_backlog_latency_case(
    server: BenchServer, *, priorities: bool, backlog: int, otp_rate: float, seconds: float
) -> BacklogLatencyResult:
    args = ["--provider", "null://", "--kinds", "otp,verification", "--metrics-port", "0"]
    args += ["--log-level", "info", "--log-format", "json"]
    if priorities:
        args += ["--priorities", "otp=10/10s,verification=0/1h"]
    otps = int(otp_rate * seconds)
    label = "otp-priority" if priorities else "otp-fifo"
    transactions: dict[int, float] = {}  # outbox id: the producer's transaction, seconds
    try:
        with server.database(label, leasebox_schema=True) as dsn:
            _seed(dsn, "verification", backlog, "v")
            with _workers(dsn, label, 1, args), psycopg.connect(dsn) as conn:
                start = time.perf_counter()
                for i in range(otps):
                    pause = start + i / otp_rate - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                    message = OutboxMessage(
                        kind="otp", recipient=f"otp{i}@example.com", secrets={"code": "424242"}
                    )
                    began = time.perf_counter()
                    with conn.transaction():
                        receipt = enqueue(conn, message)
                    transactions[receipt.outbox_id] = time.perf_counter() - began
                _wait(lambda: _otps_sent(dsn) >= otps, 120, "the OTPs to be sent")
                rows = conn.execute(OTPS_BEHIND, {"backlog": backlog}).fetchall()
    except RuntimeError as exc:
        return BacklogLatencyResult(priorities, backlog, otps, 0, 0, None, None, None, str(exc))
    if not rows:
        error = "no OTP arrived while a tenth of the backlog was left"
        return BacklogLatencyResult(priorities, backlog, otps, 0, 0, None, None, None, error)
    if any(value is None for row in rows for value in row):
        # The wait above saw every OTP sent: a row without its claim or send is a fault.
        error = "an OTP behind the backlog has no claim or no send"
        return BacklogLatencyResult(
            priorities, backlog, otps, len(rows), 0, None, None, None, error
        )
    latencies = [float(r[1]) for r in rows]
    columns = {
        "producer_transaction": [transactions[int(r[0])] for r in rows],
        "to_claim": [float(r[2]) for r in rows],
        "claim_to_sent": [float(r[3]) for r in rows],
    }
    return BacklogLatencyResult(
        priorities,
        backlog,
        otps,
        len(rows),
        len(rows),
        percentile(latencies, 0.5) * 1000,
        percentile(latencies, 0.99) * 1000,
        max(latencies) * 1000,
        parts={
            part: (percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000)
            for part, values in columns.items()
        },
    )


def _otps_sent(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM leasebox.messages WHERE kind = 'otp' AND status = 'sent'"
        ).fetchone()
    return 0 if row is None else int(row[0])


def run_backlog_latency(
    server: BenchServer, backlog: int, otp_rate: float, seconds: float
) -> list[BacklogLatencyResult]:
    return [
        run_backlog_latency_case(
            server, priorities=p, backlog=backlog, otp_rate=otp_rate, seconds=seconds
        )
        for p in (True, False)
    ]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
