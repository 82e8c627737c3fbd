"""The reliability suite's rig: a real SMTP server, real worker processes, a seeded outbox.

The SMTP server (aiosmtpd, on its own thread and loop) counts every accepted message by
its Message-ID and delivery key, and can be told to fail a share of sends transiently,
refuse addresses permanently, slow down, hold each send to one address until the test lets
that very send go, or hold every send at a gate (closed by the test, or by itself after so
many deliveries). Tests synchronise on what the server saw (sends held, sends in `DATA`,
copies taken), never on a delay. Workers are real `leasebox worker` processes with short
leases and polls; each has its own metrics port and its logs in files (a pipe could fill and
stall it). Every process is killed at teardown.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any

import psycopg
from aiosmtpd.controller import Controller
from psycopg import sql

from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.testing.embedded import EmbeddedPostgres
from leasebox.testing.ports import free_port
from support.waiting import wait_for

# Short polls and backoff keep the suite fast. Leases are long unless a test needs rows
# reclaimed soon: a short lease on a busy machine expires under a worker that is merely slow,
# and its rows are then sent twice, which is the guarantee working, but not a fault-free run.
LONG_LEASE = 30.0
SHORT_LEASE = 3.0
WORKER_ARGS = (
    "--poll-interval",
    "0.2",
    "--grace",
    "2",
    "--backoff-base",
    "0.05",
    "--backoff-max",
    "0.5",
    "--log-level",
    "info",
)


COLUMNS = (
    "bucket",
    "kind",
    "aggregate_id",
    "recipient",
    "template",
    "data",
    "secrets",
    "delivery_key",
    "max_attempts",
)


class SmtpSink:
    """aiosmtpd handler: accepts, fails or holds messages as told, and counts what it took."""

    def __init__(self, seed: int = 7) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.transient_ratio = 0.0
        self.rejected: set[str] = set()
        self.delay = 0.0
        self.hold: str | None = None
        """Every send to this address waits for its own event in `held`, in arrival order."""
        self.held: list[threading.Event] = []
        self.gate = threading.Event()
        """Cleared, every send waits before it is taken until it is set again."""
        self.gate.set()
        self.close_gate_at: int | None = None
        """Once this many copies are taken the gate closes by itself (then this is None)."""
        self.copies: dict[str, list[str]] = defaultdict(list)  # delivery key -> Message-IDs
        self.transient_failures = 0
        self.recipient_attempts: Counter[str] = Counter()
        self.in_data = 0

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        with self._lock:
            self.recipient_attempts[address] += 1
        if address in self.rejected:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self._lock:
            self.in_data += 1
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.hold is not None and self.hold in envelope.rcpt_tos:
                release = threading.Event()
                with self._lock:
                    self.held.append(release)
                await _until(release)
            with self._lock:
                if self.close_gate_at is not None and self._taken() >= self.close_gate_at:
                    self.close_gate_at = None
                    self.gate.clear()
            await _until(self.gate)
            with self._lock:
                if self.transient_ratio and self._rng.random() < self.transient_ratio:
                    self.transient_failures += 1
                    return "451 4.3.0 temporary failure, try again"
                headers = BytesHeaderParser().parsebytes(envelope.content)
                key = str(headers["X-Leasebox-Delivery-Key"])
                self.copies[key].append(str(headers["Message-ID"]))
            return "250 OK"
        finally:
            with self._lock:
                self.in_data -= 1

    def _taken(self) -> int:
        return sum(len(ids) for ids in self.copies.values())

    @property
    def delivered(self) -> int:
        with self._lock:
            return self._taken()

    @property
    def holding(self) -> int:
        """Sends to the `hold` address that arrived (released or not)."""
        with self._lock:
            return len(self.held)

    def release_all(self) -> None:
        with self._lock:
            for release in self.held:
                release.set()
        self.gate.set()

    def duplicates(self) -> dict[str, list[str]]:
        with self._lock:
            return {key: list(ids) for key, ids in self.copies.items() if len(ids) > 1}


async def _until(event: threading.Event) -> None:
    """Wait for an event the test's thread sets; this loop keeps serving meanwhile."""
    while not event.is_set():  # noqa: ASYNC110 - a threading event, set from another thread
        await asyncio.sleep(0.01)


class SmtpServer:
    """The sink served on a fixed port, which can go away and come back (a provider outage)."""

    def __init__(self, sink: SmtpSink, port: int) -> None:
        self.sink = sink
        self.port = port
        self._controller: Controller | None = None

    def start(self) -> None:
        self._controller = Controller(self.sink, hostname="127.0.0.1", port=self.port)
        self._controller.start()

    def stop(self) -> None:
        self.sink.release_all()
        if self._controller is not None:
            self._controller.stop()
            self._controller = None


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    metrics_port: int
    log_path: Path

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def metric(self, sample: str) -> float:
        """The value of one sample line, e.g. `leasebox_sent_total{kind="otp"}` (0 if absent)."""
        for line in self.metrics().splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def readiness(self) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return int(response.status), str(response.read().decode())
        except urllib.error.HTTPError as error:
            return error.code, str(error.read().decode())


@dataclass
class Workers:
    """Starts `leasebox worker` processes and kills whatever is left at teardown."""

    dsn: str
    smtp_port: int
    directory: Path
    started: list[WorkerProcess] = field(default_factory=list)

    def start(
        self, *extra: str, provider_options: str = "", lease: float = LONG_LEASE
    ) -> WorkerProcess:
        name = f"w{len(self.started) + 1}"
        port = free_port()
        log_path = self.directory / f"{name}.log"
        provider = f"smtp://127.0.0.1:{self.smtp_port}?starttls=false{provider_options}"
        args = [
            sys.executable,
            "-m",
            "leasebox",
            "worker",
            "--provider",
            provider,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            "--worker-id",
            name,
            "--log-format",
            "json",
            *WORKER_ARGS,
            "--lease-seconds",
            str(lease),
            *extra,
        ]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "LEASEBOX_DSN": self.dsn},
            )
        worker = WorkerProcess(name, process, port, log_path)
        self.started.append(worker)
        return worker

    def logs(self) -> str:
        """The end of every worker's log, for a failure message."""
        return "\n".join(f"== {w.name}\n{w.log()[-2000:]}" for w in self.started)

    def wait_answering(self, worker: WorkerProcess, within: float = 30) -> None:
        """Until the worker's HTTP server answers: alive, ready or not."""
        wait_for(lambda: _answers(worker), what=lambda: worker.log(), timeout=within)

    def wait_ready(self, worker: WorkerProcess, within: float = 60) -> None:
        """Until the worker says it is ready (its provider started, it claims)."""
        wait_for(
            lambda: _answers(worker) and worker.readiness()[0] == 200,
            what=lambda: worker.log(),
            timeout=within,
        )

    def stop_all(self, within: float = 30) -> None:
        """SIGTERM every live worker and require a clean exit."""
        alive = [w for w in self.started if w.process.poll() is None]
        for worker in alive:
            worker.process.send_signal(signal.SIGTERM)
        for worker in alive:
            code = worker.process.wait(timeout=within)
            assert code == 0, worker.log()[-3000:]

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
                worker.process.kill()
                worker.process.wait(timeout=30)


@dataclass(frozen=True)
class RestartableDatabase:
    """A migrated database on a server the test may stop and start again."""

    server: EmbeddedPostgres
    dsn: str


def lease_losses(logs: list[str]) -> list[int]:
    """The outbox ids of the leases each worker logged as lost (once per worker and row).

    A lease lost under a live worker (stalled past it on a busy machine) is the one other
    way a message is sent twice; a worker logs each such loss with the row's id.
    """
    found = []
    for log in logs:
        ids = set()
        for line in log.splitlines():
            if '"lease lost' in line or '"lease could not be extended' in line:
                ids.add(int(json.loads(line)["outbox_id"]))
        found.extend(sorted(ids))
    return found


def _answers(worker: WorkerProcess) -> bool:
    assert worker.process.poll() is None, worker.log()[-3000:]
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/healthz", timeout=1).close()
    except OSError:
        return False
    return True


def seed(
    dsn: str, count: int, *, recipient: Callable[[int], str] | None = None, max_attempts: int = 8
) -> list[str]:
    """Insert `count` ready OTPs in one COPY (and their queue rows in one statement); returns
    their delivery keys."""
    cipher = PayloadCipher(allow_plaintext=True)  # the workers need no keys to open these
    keys = [f"otp:{uuid.uuid4().hex}" for _ in range(count)]
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        today = cur.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()
        assert today is not None
        statement = sql.SQL("COPY leasebox.outbox ({}) FROM STDIN").format(
            sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
        )
        with cur.copy(statement) as copy:
            for i, key in enumerate(keys):
                address = recipient(i) if recipient else f"user{i}@example.com"
                copy.write_row(
                    (
                        today[0],
                        "otp",
                        f"user-{i}",
                        address,
                        "otp",
                        '{"minutes_valid": 5}',
                        cipher.seal({"code": f"{i:06d}"}),
                        key,
                        max_attempts,
                    )
                )
        cur.execute(
            "INSERT INTO leasebox.queue"
            " (id, bucket, kind, aggregate_id, delivery_key, max_attempts, created_at)"
            " SELECT id, bucket, kind, aggregate_id, delivery_key, max_attempts, created_at"
            " FROM leasebox.outbox WHERE delivery_key = ANY(%s)",
            (keys,),
        )
    return keys


def statuses(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM leasebox.messages GROUP BY status"
        ).fetchall()
    return {status: int(n) for status, n in rows}


def safe_statuses(dsn: str) -> dict[str, int]:
    """`statuses`, or {} while the database is down."""
    try:
        return statuses(dsn)
    except psycopg.OperationalError:
        return {}
