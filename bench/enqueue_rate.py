"""The enqueue benchmark: logical sends per second through leasebox's producer API.

A producer pays for the receipt (an advisory lock, a lookup, the insert, the receipt upsert)
on top of the outbox insert. This measures what that costs against a plain `INSERT` of the
same row, from one connection: one transaction per send (an API request that sends one
OTP: on an autocommit connection, as the peers' calls run, and between a BEGIN and a COMMIT
of its own), the same sends 100 to a transaction, and a batch path, `enqueue_many` (one call for
100 messages, receipts included), against a plain multi-row `INSERT` of the same 100 rows.
A leasebox without `enqueue_many` is reported as missing, not measured by something else.
Building the `OutboxMessage`s is part of the API call, so it is inside the timing; the plain
inserts get ready values.

Beside each target, leasebox's own statements run with their arguments built before the clock
starts (the statement `enqueue` sends, and the lock and write statements of `enqueue_many`):
what a send costs the server and the driver with none of leasebox's Python around it, so that
a run shows how much of a gap to the yardstick no client-side work can close.

The peers' producers (`bench/enqueue_peers.py`) run in the same run, beside leasebox's: PgQueuer's
`enqueue` with a `dedupe_key` and pg-boss's `send` with a `singletonKey`, one per transaction,
and their batch calls against `enqueue_many`. Those are the targets; the plain inserts are
reported. Every case gets a fresh database whose schema is installed and analysed before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import leasebox
from bench import enqueue_peers
from bench.pgserver import BenchServer
from bench.sqlfiles import bench_query
from leasebox.db.queries import DEFAULT_SCHEMA, query_bytes
from leasebox.messages import DEFAULT_RECEIPT_TTL_SECONDS, OutboxMessage
from leasebox.producer.batch import _prepare as prepare_batch
from leasebox.producer.batch import _written as batch_statements
from leasebox.producer.enqueue import enqueue, plan_enqueue
from leasebox.producer.payload_crypto import default_cipher

BATCH = 100


# Each send its own transaction: one statement on an autocommit connection, as the peers'
# calls run; and the same send between a BEGIN and a COMMIT of its own, as in an
# application's transaction (two more round trips, which the application's own write shares).
ONE = "one per transaction"
WRAPPED = "one per BEGIN ... COMMIT"
LOOP = f"{BATCH} per transaction"
MANY = f"batch of {BATCH}, one call"
PLAIN = "plain INSERT"
PLAIN_MANY = "plain multi-row INSERT"
LEASEBOX = "leasebox.enqueue + receipt"
LEASEBOX_MANY = "leasebox.enqueue_many + receipts"
LEASEBOX_STATEMENT = "leasebox's enqueue statement, arguments ready"
LEASEBOX_MANY_STATEMENTS = "leasebox's enqueue_many statements, arguments ready"

Send = Callable[[psycopg.Connection[Any], int], None]
SendMany = Callable[[psycopg.Connection[Any], range], None]


@dataclass(frozen=True)
class EnqueueResult:
    method: str
    mode: str
    sends: int
    seconds: float
    error: str = ""
    # The rate of every round of the case, in order (the kept one is the fastest).
    round_rates: tuple[float, ...] = ()

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
            "round_rates": list(self.round_rates),
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
    enqueue(conn, _message(i), idempotency_key=_key(i), scope="bench")


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
        idempotency_keys=[_key(i) for i in numbers],
        scope="bench",
    )


def _key(i: int) -> str:
    return f"otp-request-{i}"


class _ReadyStatement:
    """The statement `leasebox.enqueue` sends for message `i`, its arguments built up front."""

    def __init__(self, numbers: Iterable[int]) -> None:
        cipher = default_cipher()
        self._query = query_bytes("enqueue", DEFAULT_SCHEMA)
        self._params: dict[int, dict[str, Any]] = {}
        for i in numbers:
            plan = plan_enqueue(_message(i), idempotency_key=_key(i), scope="bench", cipher=cipher)
            ((name, params),) = next(plan).queries
            if name != "enqueue":
                raise RuntimeError(f"enqueue's plan starts with {name!r}, not its statement")
            self._params[i] = params

    def __call__(self, conn: psycopg.Connection[Any], i: int) -> None:
        conn.execute(self._query, self._params[i], prepare=True).fetchone()


class _ReadyBatch:
    """The statements `leasebox.enqueue_many` sends for a batch, their arguments built up front."""

    def __init__(self, batches: list[range]) -> None:
        cipher = default_cipher()
        self._batches = {
            numbers.start: prepare_batch(
                [_message(i) for i in numbers],
                [_key(i) for i in numbers],
                "bench",
                None,
                None,
                DEFAULT_RECEIPT_TTL_SECONDS,
                DEFAULT_SCHEMA,
                cipher,
            )
            for numbers in batches
        }

    def __call__(self, conn: psycopg.Connection[Any], numbers: range) -> None:
        batch_statements(conn, self._batches[numbers.start])


def _warm_numbers() -> range:
    """The messages that warm a connection's statement cache before the clock starts."""
    return range(-1_000_050, -1_000_000)


def _warm_batches(per_call: int) -> list[range]:
    return [
        range(first, first + per_call)
        for first in range(-1_000_000 - 5 * per_call, -1_000_000, per_call)
    ]


def _batches(count: int, per_call: int) -> list[range]:
    return [range(first, min(first + per_call, count)) for first in range(0, count, per_call)]


def _analysed(conn: psycopg.Connection[Any]) -> None:
    conn.execute("ANALYZE")
    conn.commit()


def _timed(dsn: str, send: Send, count: int, per_transaction: int) -> float:
    """Sends between a BEGIN and a COMMIT, `per_transaction` at a time."""
    with psycopg.connect(dsn) as conn:
        _analysed(conn)
        for i in _warm_numbers():
            send(conn, i)
        conn.commit()
        start = time.perf_counter()
        for numbers in _batches(count, per_transaction):
            with conn.transaction():
                for i in numbers:
                    send(conn, i)
        return time.perf_counter() - start


def _timed_autocommit(dsn: str, send: Send, count: int) -> float:
    """Sends on an autocommit connection: each one a transaction of its own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _analysed(conn)
        for i in _warm_numbers():
            send(conn, i)
        start = time.perf_counter()
        for i in range(count):
            send(conn, i)
        return time.perf_counter() - start


def _timed_many(dsn: str, send: SendMany, count: int, per_call: int) -> float:
    with psycopg.connect(dsn) as conn:
        _analysed(conn)
        for numbers in _warm_batches(per_call):
            send(conn, numbers)
        conn.commit()
        start = time.perf_counter()
        for numbers in _batches(count, per_call):
            with conn.transaction():
                send(conn, numbers)
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


def _peer_case(server: BenchServer, peer: str, count: int, per_call: int) -> EnqueueResult:
    name = enqueue_peers.method(peer, per_call)
    mode = ONE if per_call == 1 else MANY
    warm = [range(i, i + 1) for i in _warm_numbers()] if per_call == 1 else _warm_batches(per_call)
    expected = count + sum(len(r) for r in warm)
    try:
        seconds, rows = enqueue_peers.peer_case(server, peer, count, per_call, _batches, warm)
    except Exception as exc:  # a peer's own error (asyncpg, node) voids its case, not the run
        return EnqueueResult(name, mode, count, 0.0, f"{type(exc).__name__}: {exc}"[:200])
    if rows != expected:
        return EnqueueResult(name, mode, count, seconds, f"{rows} jobs, not {expected}")
    return EnqueueResult(name, mode, count, seconds)


def _peer_cases(
    server: BenchServer, peers: Sequence[str], count: int, per_call: int
) -> list[EnqueueResult]:
    return [_peer_case(server, peer, count, per_call) for peer in peers]


def best_of_rounds(rounds: Sequence[Sequence[EnqueueResult]]) -> list[EnqueueResult]:
    """Each case's fastest round, with the rates of all; a case that failed in any round is
    reported by its failure (a void measurement is never hidden behind a good one)."""
    kept = []
    for cases in zip(*rounds, strict=True):
        rates = tuple(round(c.rate, 1) for c in cases)
        failed = next((c for c in cases if c.error), None)
        best = failed or max(cases, key=lambda c: c.rate)
        kept.append(replace(best, round_rates=rates))
    return kept


def run_enqueue(
    server: BenchServer,
    single: int,
    batched: int,
    peers: Sequence[str] = (),
    rounds: int = 1,
) -> list[EnqueueResult]:
    """Every case `rounds` times, each round running every case once (so that a burst of
    load on the shared machine hits a round, not one system), and each case's fastest round
    kept."""
    return best_of_rounds(
        [_one_round(server, single, batched, peers) for _ in range(max(rounds, 1))]
    )


def _one_round(
    server: BenchServer, single: int, batched: int, peers: Sequence[str]
) -> list[EnqueueResult]:
    """Each method beside its yardstick, yardstick first, so that a change in the machine's
    load hits both alike, and the `peers` (of `enqueue_peers.PEERS`) right after leasebox;
    every case checks that it wrote exactly the rows it sent."""
    warm_one, warm_many = len(_warm_numbers()), len(_warm_batches(BATCH)) * BATCH
    statement = _ReadyStatement([*_warm_numbers(), *range(single)])
    results = []
    for method, send in (
        (PLAIN, _plain_insert),
        (LEASEBOX, _leasebox_enqueue),
        (LEASEBOX_STATEMENT, statement),
    ):
        results.append(
            _case(
                server,
                method,
                ONE,
                single,
                partial(_timed_autocommit, send=send, count=single),
                single + warm_one,
            )
        )
    results += _peer_cases(server, peers, single, 1)
    for method, send in ((PLAIN, _plain_insert), (LEASEBOX, _leasebox_enqueue)):
        results.append(
            _case(
                server,
                method,
                WRAPPED,
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
        missing = "missing: leasebox has no enqueue_many"
        results += [
            EnqueueResult(m, MANY, 0, 0.0, missing)
            for m in (LEASEBOX_MANY, LEASEBOX_MANY_STATEMENTS)
        ]
        return results + _peer_cases(server, peers, batched, BATCH)
    statements = _ReadyBatch([*_warm_batches(BATCH), *_batches(batched, BATCH)])
    batch_methods: tuple[tuple[str, SendMany], ...] = (
        (LEASEBOX_MANY, _leasebox_enqueue_many),
        (LEASEBOX_MANY_STATEMENTS, statements),
    )
    for method, send_many in batch_methods:
        results.append(
            _case(
                server,
                method,
                MANY,
                batched,
                partial(_timed_many, send=send_many, count=batched, per_call=BATCH),
                batched + warm_many,
            )
        )
    return results + _peer_cases(server, peers, batched, BATCH)
