"""Deadlines for waits on the operator and the control plane, derived from this machine.

A fixed deadline (10 s, 60 s) is written for an idle machine; on one that also runs another
test process and somebody's build, the operator takes seconds to import and to be scheduled,
and a wait that passes every day fails. A deadline is only how long a test waits before it
calls a change missing, so it may be long; it must never be too short.

The session measures what every wait depends on: how long its control plane took to be
ready, and how long the operator took to answer (its metrics page) after `helm install`.
Each wait of the cluster tier takes the figure written at its call site as a floor and
waits at least `FACTOR` times the slowest start-up measured: a machine slow to start is slow
to react too. `wait_for` here is `support.waiting.wait_for` with that deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from support import waiting

T = TypeVar("T")
# How many start-ups a reaction of the operator may take: a watch event, a reconcile with a
# database read and a retried API call, one resync.
FACTOR = 3.0
# Even a machine that started very slowly does not hold a test longer than this for one wait.
CEILING_SECONDS = 600.0

_start_ups: dict[str, float] = {}


def record_start_up(what: str, seconds: float) -> None:
    """Remember how long `what` (the control plane, the operator) took to start this session."""
    _start_ups[what] = seconds


def start_up_seconds() -> float:
    """The slowest start-up measured this session (0 before any)."""
    return max(_start_ups.values(), default=0.0)


def patience(floor: float) -> float:
    """A deadline of at least `floor` seconds, longer on a machine that started slowly."""
    return min(max(floor, FACTOR * start_up_seconds()), max(floor, CEILING_SECONDS))


def wait_for(
    probe: Callable[[], T | None], *, what: waiting.Description, timeout: float = 10.0
) -> T:
    """`support.waiting.wait_for` with `timeout` as the floor of a measured deadline."""
    return waiting.wait_for(probe, what=what, timeout=patience(timeout))
