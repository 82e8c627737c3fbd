"""The fault-injection suite's rig: seed OTPs with secret codes, run a real worker in-process
against a hostile server, and judge the run by the invariants of the delivery guarantee.

A scenario seeds rows through `enqueue` (codes encrypted with a key of the test's own), runs
a `Worker` with a real provider and a real pool until every row is final, and then hands
`judge` what the server took per delivery key. `judge` asserts what must hold whatever the
fault: nothing lost, every sent row taken at least once, never two copies within one attempt
(each copy carries its attempt number), duplicates only where the scenario allows them, no
code in any log line, metric, stored error or readiness answer, and each message's attempt
history a walk of the state diagram that ends where its row is (`support.history`). The
verdict (copies per message, final states) goes into the table the suite prints at the end.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from leasebox import OutboxMessage, enqueue
from leasebox.delivery.providers.base import Provider
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.worker import Worker, database_clock
from support.history import check_histories, history_of

SETTINGS = WorkerSettings(
    kinds=("otp",),
    concurrency=4,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.05,
    listen=False,
    grace_seconds=5,
    max_attempts=4,
    backoff_base=0.05,
    backoff_max=0.2,
    worker_id="fault-worker",
)
FINAL = ("sent", "dead", "superseded")


@dataclass(frozen=True)
class Seeded:
    """The rows of a scenario: delivery keys in order, and the code each one carries."""

    keys: list[str]
    codes: dict[str, str]


@dataclass(frozen=True)
class Verdict:
    """One line of the suite's table."""

    scenario: str
    messages: int
    copies: Counter[int]  # copies taken -> how many messages
    states: Counter[str]  # "sent" or "dead (reason)" -> how many messages

    def row(self) -> tuple[str, str, str]:
        copies = ", ".join(f"{n}x{c}" for c, n in sorted(self.copies.items()))
        states = ", ".join(f"{state} {n}" for state, n in sorted(self.states.items()))
        return self.scenario, f"{copies} (of {self.messages})", states


@dataclass
class Run:
    """What one worker run left behind, for `judge`."""

    worker: Worker
    logs: list[logging.LogRecord]
    readiness: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """Every log line with its fields, the metrics and what readiness said."""
        lines = [f"{r.getMessage()} {r.__dict__!r}" for r in self.logs]
        exposition = self.worker.metrics.exposition().decode()
        return "\n".join([*lines, exposition, *self.readiness])


class Evidence(Protocol):
    """Everything a run showed the world: logs, metrics, readiness (searched for codes)."""

    @property
    def text(self) -> str: ...


@dataclass(frozen=True)
class Printed:
    """The evidence of a worker process: what it printed and what its endpoints answered."""

    text: str


VERDICTS: list[Verdict] = []


def seed(conn: psycopg.Connection[Any], cipher: PayloadCipher, count: int, **fields: Any) -> Seeded:
    """`count` OTPs through the producer API, each with a random code; committed."""
    keys, codes = [], {}
    for i in range(count):
        code = f"K{secrets.token_hex(5)}"
        receipt = enqueue(
            conn,
            OutboxMessage(
                kind="otp",
                recipient=f"user{i}@example.com",
                aggregate_id=f"user-{i}",
                data={"minutes_valid": 5},
                secrets={"code": code},
                **fields,
            ),
            cipher=cipher,
        )
        keys.append(receipt.delivery_key)
        codes[receipt.delivery_key] = code
    conn.commit()
    return Seeded(keys, codes)


def rows(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute("SELECT * FROM leasebox.messages").fetchall()
    conn.rollback()
    return {row["delivery_key"]: row for row in found}


async def run_until_final(
    pool: AsyncConnectionPool,
    provider: Provider,
    cipher: PayloadCipher,
    conn: psycopg.Connection[Any],
    *,
    settings: WorkerSettings = SETTINGS,
    within: float = 60.0,
    while_running: Callable[[Worker], Any] | None = None,
    clock: Callable[[], datetime | None] = database_clock,
) -> Run:
    """Run a worker until every row is sent or dead, then stop it; logs captured.

    `while_running(worker)` is awaited on every look at the rows; `clock` is the worker's.
    """
    await provider.start()
    worker = Worker(settings, pool, provider, TemplateRenderer(), cipher=cipher, clock=clock)
    capture = _Capture()
    logger = logging.getLogger("leasebox")
    logger.addHandler(capture)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    task = asyncio.get_running_loop().create_task(worker.run())
    run = Run(worker, capture.records)
    try:
        async with asyncio.timeout(within):
            while not all(r["status"] in FINAL for r in rows(conn).values()):
                assert not task.done(), "the worker stopped on its own"
                if while_running is not None:
                    await while_running(worker)
                await asyncio.sleep(0.02)
        problem = await worker.readiness_problem()
        run.readiness.extend([problem or "ready", *worker.status_lines()])
        assert not task.done(), "the worker stopped on its own"
    finally:
        worker.request_stop()
        async with asyncio.timeout(30):
            await task
        logger.removeHandler(capture)
        logger.setLevel(previous)
        await provider.close()
    assert not worker.failed, "the worker hit an internal error"
    return run


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def ambiguous_attempts(conn: psycopg.Connection[Any], outbox_id: int) -> set[int]:
    """The attempts of a message that its worker recorded as possibly accepted."""
    return {
        e.attempt
        for e in history_of(conn, outbox_id)
        if e.error_class == "ambiguous" and e.attempt is not None
    }


def judge(
    scenario: str,
    conn: psycopg.Connection[Any],
    seeded: Seeded,
    taken: Mapping[str, Sequence[Any]],
    run: Evidence,
    *,
    duplicates: bool = False,
) -> Verdict:
    """Assert the invariants of the guarantee; return (and record) the scenario's verdict.

    `taken[key]` are the copies the server took, each with an `attempt`. `duplicates` says
    whether the scenario injected an ambiguous drop, a crash or a lease loss: only then may a
    message have more than one copy (and never two within one attempt), apart from a copy
    whose attempt the worker itself recorded as `ambiguous` (its reply came too late).
    """
    found = rows(conn)
    assert set(found) == set(seeded.keys), "rows appeared or vanished"
    assert check_histories(conn) == len(found)  # each row's history is a walk to where it is
    copies: Counter[int] = Counter()
    states: Counter[str] = Counter()
    for key in seeded.keys:
        row, got = found[key], list(taken.get(key, []))
        assert row["status"] in FINAL, f"{key} is still {row['status']}: lost"
        if row["status"] == "sent":
            assert got, f"{key} is marked sent but the server never took it"
        attempts = [c.attempt for c in got]
        assert len(attempts) == len(set(attempts)), f"{key}: two copies in one attempt {attempts}"
        assert all(1 <= a <= row["attempts"] for a in attempts), (attempts, row["attempts"])
        if not duplicates:
            # A copy the server took but never confirmed in time (a machine slow enough to miss
            # the reply's deadline) is the one duplicate the guarantee allows: the worker
            # recorded that attempt as `ambiguous`. Any other second copy is a fault.
            unconfirmed = ambiguous_attempts(conn, row["id"]) if len(got) > 1 else set()
            earlier = sorted(attempts)[:-1]
            assert set(earlier) <= unconfirmed, (
                f"{key} was taken {len(got)} times without an injected fault"
            )
        for column in ("last_error", "provider_message_id", "last_error_class"):
            value = row[column]
            assert value is None or "\x00" not in value
        copies[len(got)] += 1
        states["sent" if row["status"] == "sent" else f"dead ({row['dead_reason']})"] += 1
    everything = run.text + "\n" + repr(list(found.values()))
    leaked = [code for code in seeded.codes.values() if code in everything]
    assert leaked == [], "a code reached a log line, a metric, a stored error or readiness"
    verdict = Verdict(scenario, len(seeded.keys), copies, states)
    VERDICTS.append(verdict)
    return verdict
