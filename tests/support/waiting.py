"""Waiting for a condition that another thread or process makes true.

Tests synchronise on positive signals (an object appears, a condition flips), never on a
fixed sleep: `wait_for` polls a probe until it returns something truthy and fails with
what it waited for and the last value it saw (`wait_for_async` in an event loop, which it
keeps serving); `second_while_first_is_open` proves that a statement waits for another
transaction's lock before it lets that transaction end. These are the only poll-until
helpers of the tests: a test that waits uses one of them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")
# What a wait waits for: words, or a function called on timeout to say more (a worker's log).
Description = str | Callable[[], object]


def wait_for(probe: Callable[[], T | None], *, what: Description, timeout: float = 10.0) -> T:
    """Call `probe` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise _timed_out(timeout, what, last)


async def wait_for_async(
    probe: Callable[[], T | None],
    *,
    what: Description,
    timeout: float = 10.0,  # noqa: ASYNC109 - the same words as `wait_for`'s, on purpose
) -> T:
    """`wait_for` inside an event loop: the loop runs the code under test between probes."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        await asyncio.sleep(0.01)
    raise _timed_out(timeout, what, last)


def running(process: Any) -> bool:
    """True while a child process runs; fails at once with its error output once it exited
    (a probe's first clause, so that a wait does not outlast a crash)."""
    code = process.poll()
    assert code is None, f"the process exited with {code}: {process.communicate()[1]}"
    return True


def _timed_out(timeout: float, what: Description, last: object) -> AssertionError:
    said = what if isinstance(what, str) else what()
    return AssertionError(f"timed out after {timeout:g}s waiting for {said} (last: {last!r})")


def waiting_on_a_lock(conn: psycopg.Connection[Any], application_name: str) -> bool:
    """Whether a session named `application_name` is blocked on a lock right now."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = %s AND wait_event_type = 'Lock'",
        (application_name,),
    ).fetchone()
    conn.rollback()
    return bool(row and row[0])


def second_while_first_is_open(
    db_dsn: str,
    db_conn: psycopg.Connection[Any],
    first: psycopg.Connection[Any],
    second: Callable[[psycopg.Connection[Any]], Any],
    *,
    commit_first: bool = True,
) -> Any:
    """Run `second` on its own connection; once it waits for `first`, end `first`; return
    what `second` returned or raised."""
    answers: list[Any] = []

    def run() -> None:
        try:
            with psycopg.connect(db_dsn, application_name="second-request") as conn:
                answers.append(second(conn))
                conn.commit()
        except BaseException as exc:  # asserted by the caller
            answers.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not waiting_on_a_lock(db_conn, "second-request"):
            assert time.monotonic() < deadline, "the second request never waited for the first"
            assert thread.is_alive(), f"the second request did not wait: {answers!r}"
            time.sleep(0.01)
        if commit_first:
            first.commit()
        else:
            first.rollback()
    finally:
        thread.join(timeout=30)
        first.close()
    [answer] = answers
    return answer
