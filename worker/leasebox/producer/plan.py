"""One producer logic for sync and async connections: a plan of statements, run by either.

A plan is a generator that yields `Step`s (statements sent together, pipelined) and
receives the first row of each step's last statement, by column name. `run` executes a
plan on a `psycopg.Connection` and `run_async` on an `AsyncConnection`, so `enqueue` and
`enqueue_async` share every decision and differ only in how they wait.

A plan's steps hold advisory locks for one another, so they must share a transaction. On a
connection in autocommit mode each round trip would commit and drop the locks, so a plan
of several steps runs in a transaction of its own there; a plan whose first step is its
last (`enqueue` without a guard or a suppression check) is one statement, atomic by itself,
and runs bare: one round trip.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from leasebox.db.queries import query_bytes
from leasebox.tracecontext import current_trace_context

T = TypeVar("T")
Row = dict[str, Any] | None
Plan = Generator["Step", Row, T]


@dataclass(frozen=True)
class Step:
    """Named statements sent together; the plan receives the last one's first row."""

    queries: tuple[tuple[str, dict[str, Any]], ...]
    # Nothing follows this step: the plan returns with its row.
    final: bool = False


def carried_trace_context() -> Jsonb | None:
    """The caller's trace context as the write's parameter, when the caller has one."""
    carrier = current_trace_context()
    return None if carrier is None else Jsonb(carrier)


def one(name: str, params: dict[str, Any], *, final: bool = False) -> Step:
    """A step of a single statement."""
    return Step(((name, params),), final)


def _needs_own_transaction(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], first: Step
) -> bool:
    """Whether the plan must open a transaction: autocommit, outside one, several steps."""
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return conn.autocommit and idle and not first.final


def run(conn: psycopg.Connection[Any], plan: Plan[T], schema: str) -> T:
    """Execute `plan` on `conn` in the caller's transaction; return what the plan returns.

    On an autocommit connection a plan of several steps gets a transaction of its own.
    """
    try:
        first = next(plan)
    except StopIteration as done:
        result: T = done.value
        return result
    if _needs_own_transaction(conn, first):
        with conn.transaction():
            return _run_steps(conn, plan, first, schema)
    return _run_steps(conn, plan, first, schema)


def _run_steps(conn: psycopg.Connection[Any], plan: Plan[T], step: Step, schema: str) -> T:
    try:
        while True:
            *before, (name, params) = step.queries
            cur = conn.cursor(row_factory=dict_row)
            if before:
                # One round trip: the statements and a single Sync go out together, and the
                # results come back when the pipeline closes.
                with conn.pipeline():
                    for earlier, earlier_params in before:
                        conn.execute(query_bytes(earlier, schema), earlier_params, prepare=True)
                    cur.execute(query_bytes(name, schema), params, prepare=True)
            else:
                cur.execute(query_bytes(name, schema), params, prepare=True)
            row = cur.fetchone()
            cur.close()
            following = plan.send(row)
            if step.final:
                raise RuntimeError("a producer plan went on after its final step")
            step = following
    except StopIteration as done:
        result: T = done.value
        return result


async def run_async(conn: psycopg.AsyncConnection[Any], plan: Plan[T], schema: str) -> T:
    """`run` for an async connection."""
    try:
        first = next(plan)
    except StopIteration as done:
        result: T = done.value
        return result
    if _needs_own_transaction(conn, first):
        async with conn.transaction():
            return await _run_steps_async(conn, plan, first, schema)
    return await _run_steps_async(conn, plan, first, schema)


async def _run_steps_async(
    conn: psycopg.AsyncConnection[Any], plan: Plan[T], step: Step, schema: str
) -> T:
    try:
        while True:
            *before, (name, params) = step.queries
            cur = conn.cursor(row_factory=dict_row)
            if before:
                async with conn.pipeline():
                    for earlier, earlier_params in before:
                        await conn.execute(
                            query_bytes(earlier, schema), earlier_params, prepare=True
                        )
                    await cur.execute(query_bytes(name, schema), params, prepare=True)
            else:
                await cur.execute(query_bytes(name, schema), params, prepare=True)
            row = await cur.fetchone()
            await cur.close()
            following = plan.send(row)
            if step.final:
                raise RuntimeError("a producer plan went on after its final step")
            step = following
    except StopIteration as done:
        result: T = done.value
        return result
