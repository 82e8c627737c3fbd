"""The enqueue benchmark: logical sends per second through `leasebox.enqueue`.

A producer pays for the receipt (an advisory lock, a lookup, the insert, the receipt upsert)
on top of the outbox insert. This measures what that costs against a plain `INSERT` of the
same row, from one connection: one transaction per send (an API request that sends one
OTP), and batched (many sends per transaction). Building the `OutboxMessage` is part of
the API call, so it is inside the timing; the plain insert gets a ready dict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.pgserver import BenchServer
from bench.sqlfiles import bench_query
from leasebox.messages import OutboxMessage
from leasebox.producer.enqueue import enqueue

BATCH = 100


@dataclass(frozen=True)
class EnqueueResult:
    method: str
    mode: str
    sends: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.sends / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "mode": self.mode,
            "sends": self.sends,
            "seconds": round(self.seconds, 3),
            "rate_per_second": round(self.rate, 1),
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


def _leasebox_enqueue(conn: psycopg.Connection[Any], i: int) -> None:
    message = OutboxMessage(
        kind="otp",
        recipient=f"user{i}@example.com",
        aggregate_id=f"user-{i}",
        data={"name": f"User {i}", "minutes_valid": 10},
        secrets={"code": f"{i % 1000000:06d}"},
    )
    enqueue(conn, message, idempotency_key=f"otp-request-{i}", scope="bench")


def _timed(
    dsn: str, send: Callable[[psycopg.Connection[Any], int], None], count: int, per_transaction: int
) -> float:
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


def run_enqueue(server: BenchServer, single: int, batched: int) -> list[EnqueueResult]:
    """Both methods, one send per transaction and `BATCH` per transaction, alternating so
    that a change in the machine's load hits both alike."""
    results = []
    methods = (("plain INSERT", _plain_insert), ("leasebox.enqueue + receipt", _leasebox_enqueue))
    for mode, count, per_transaction in (
        ("one per transaction", single, 1),
        (f"{BATCH} per transaction", batched, BATCH),
    ):
        for method, send in methods:
            with server.database("enqueue", leasebox_schema=True) as dsn:
                seconds = _timed(dsn, send, count, per_transaction)
            results.append(EnqueueResult(method, mode, count, seconds))
    return results
