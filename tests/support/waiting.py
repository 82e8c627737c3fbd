"""Waiting for a condition that another thread or process makes true.

Tests synchronise on positive signals (an object appears, a condition flips), never on a
fixed sleep: `wait_for` polls a probe until it returns something truthy and fails with
what it waited for and the last value it saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], *, what: str, timeout: float = 10.0) -> T:
    """Call `probe` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


def waiting_on_a_lock(conn: psycopg.Connection[Any], application_name: str) -> bool:
    """Whether a session named `application_name` is blocked on a lock right now."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = %s AND wait_event_type = 'Lock'",
        (application_name,),
    ).fetchone()
    conn.rollback()
    return bool(row and row[0])
