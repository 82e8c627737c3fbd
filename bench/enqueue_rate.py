"""The enqueue benchmark: logical sends per second through leasebox's producer API.

A producer pays for the receipt (an advisory lock, a lookup, the insert, the receipt upsert)
on top of the outbox insert. This measures what that costs against a plain `INSERT` of the
same row, from one connection: one transaction per send (an API request that sends one
OTP), the same sends 100 to a transaction, and a batch path, `enqueue_many` (one call for
100 messages, receipts included), against a plain multi-row `INSERT` of the same 100 rows.
A leasebox without `enqueue_many` is reported as missing, not measured by something else.
Building the `OutboxMessage`s is part of the API call, so it is inside the timing; the plain
inserts get ready values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import leasebox
from bench.pgserver import BenchServer
from bench.sqlfiles import bench_query
from leasebox.messages import OutboxMessage
from leasebox.producer.enqueue import enqueue

BATCH = 100


ONE = "one per transaction"
LOOP = f"{BATCH} per transaction"
MANY = f"batch of {BATCH}, one call"
PLAIN = "plain INSERT"
PLAIN_MANY = "plain multi-row INSERT"
LEASEBOX = "leasebox.enqueue + receipt"
LEASEBOX_MANY = "leasebox.enqueue_many + receipts"

Send = Callable[[psycopg.Connection[Any], int], None]
SendMany = Callable[[psycopg.Connection[Any], range], None]


@dataclass(frozen=True)
class EnqueueResult:
    method: str
    mode: str
    sends: int
    seconds: float
    error: str = ""

    @property
    def rate(self) -> float:
        return self.sends / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "mode": self.mode,
            "sends": self.sends,
            "seconds": round(self.seconds, 3),
            "rate_per_second": round(self.rate, 1) if not self.error else None,
            "error": self.error,
        }


def _plain_insert(conn: psycopg.Connection[Any], i: int) -> None:
    conn.execute(
        bench_query("plain_insert"),
        {
            "kind": "otp",
            "aggregate_id": f"user-{i}",
            "recipient": f"user{i}@example.com",
            "template": "otp",
            "data": Jsonb({"name": f"User {i}", "minutes_valid": 10}),
            "delivery_key": f"otp:plain:{i}",
            "max_attempts": 8,
        },
    )


def _plain_insert_many(conn: psycopg.Connection[Any], numbers: range) -> None:
    conn.execute(
        bench_query("plain_insert_many"),
        {
            "kind": ["otp"] * len(numbers),
            "aggregate_id": [f"user-{i}" for i in numbers],
            "recipient": [f"user{i}@example.com" for i in numbers],
            "template": ["otp"] * len(numbers),
            "data": [Jsonb({"name": f"User {i}", "minutes_valid": 10}) for i in numbers],
            "delivery_key": [f"otp:plain:{i}" for i in numbers],
            "max_attempts": [8] * len(numbers),
        },
    )


def _message(i: int) -> OutboxMessage:
    return OutboxMessage(
        kind="otp",
        recipient=f"user{i}@example.com",
        aggregate_id=f"user-{i}",
        data={"name": f"User {i}", "minutes_valid": 10},
        secrets={"code": f"{i % 1000000:06d}"},
    )


def _leasebox_enqueue(conn: psycopg.Connection[Any], i: int) -> None:
    enqueue(conn, _message(i), idempotency_key=f"otp-request-{i}", scope="bench")


def batch_api() -> Callable[..., Any] | None:
    """leasebox's batch enqueue, when this leasebox has one."""
    found = getattr(leasebox, "enqueue_many", None)
    return found if callable(found) else None


def _leasebox_enqueue_many(conn: psycopg.Connection[Any], numbers: range) -> None:
    # The call the issue describes: messages and their receipts' keys in one call.
    api = batch_api()
    assert api is not None
    api(
        conn,
        [_message(i) for i in numbers],
        idempotency_keys=[f"otp-request-{i}" for i in numbers],
        scope="bench",
    )


def _timed(dsn: str, send: Send, count: int, per_transaction: int) -> float:
    with psycopg.connect(dsn) as conn:
        for i in range(-50, 0):  # warm the connection's statement cache
            send(conn, i - 1_000_000)
        conn.commit()
        start = time.perf_counter()
        for first in range(0, count, per_transaction):
            with conn.transaction():
                for i in range(first, min(first + per_transaction, count)):
                    send(conn, i)
        return time.perf_counter() - start


def _timed_many(dsn: str, send: SendMany, count: int, per_call: int) -> float:
    with psycopg.connect(dsn) as conn:
        for first in range(-5 * per_call, 0, per_call):  # warm the statement cache
            send(conn, range(first - 1_000_000, first - 1_000_000 + per_call))
        conn.commit()
        start = time.perf_counter()
        for first in range(0, count, per_call):
            with conn.transaction():
                send(conn, range(first, min(first + per_call, count)))
        return time.perf_counter() - start


def _count_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(bench_query("count_outbox")).fetchone()
    return int(row[0]) if row else 0


def _case(
    server: BenchServer,
    method: str,
    mode: str,
    count: int,
    timed: Callable[[str], float],
    expected_rows: int,
) -> EnqueueResult:
    with server.database("enqueue", leasebox_schema=True) as dsn:
        try:
            seconds = timed(dsn)
        except (psycopg.Error, TypeError, ValueError) as exc:
            return EnqueueResult(method, mode, count, 0.0, f"{type(exc).__name__}: {exc}"[:200])
        rows = _count_rows(dsn)
    if rows != expected_rows:
        return EnqueueResult(method, mode, count, seconds, f"{rows} rows, not {expected_rows}")
    return EnqueueResult(method, mode, count, seconds)


def run_enqueue(server: BenchServer, single: int, batched: int) -> list[EnqueueResult]:
    """Each method beside its yardstick, yardstick first, so that a change in the machine's
    load hits both alike; every case checks that it wrote exactly the rows it sent."""
    warm_one, warm_many = 50, 5 * BATCH
    results = []
    for method, send in ((PLAIN, _plain_insert), (LEASEBOX, _leasebox_enqueue)):
        results.append(
            _case(
                server,
                method,
                ONE,
                single,
                partial(_timed, send=send, count=single, per_transaction=1),
                single + warm_one,
            )
        )
    for method, send in ((PLAIN, _plain_insert), (LEASEBOX, _leasebox_enqueue)):
        results.append(
            _case(
                server,
                method,
                LOOP,
                batched,
                partial(_timed, send=send, count=batched, per_transaction=BATCH),
                batched + warm_one,
            )
        )
    results.append(
        _case(
            server,
            PLAIN_MANY,
            MANY,
            batched,
            partial(_timed_many, send=_plain_insert_many, count=batched, per_call=BATCH),
            batched + warm_many,
        )
    )
    if batch_api() is None:
        results.append(
            EnqueueResult(LEASEBOX_MANY, MANY, 0, 0.0, "missing: leasebox has no enqueue_many")
        )
    else:
        results.append(
            _case(
                server,
                LEASEBOX_MANY,
                MANY,
                batched,
                partial(_timed_many, send=_leasebox_enqueue_many, count=batched, per_call=BATCH),
                batched + warm_many,
            )
        )
    return results
