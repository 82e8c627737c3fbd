"""Writing a pool's status: one writer per pool, patches only what changed.

The reconcile handler and the poll loop both report into the same status, and a JSON
merge patch replaces a list whole, so two writers patching `conditions` from their own
copies would undo each other. Each pool therefore has one `StatusWriter` (kept in the
pool's kopf memo) that holds the conditions as last written, applies updates under a
lock and sends a patch only when a field or a condition actually changed.

`Ready` is a summary the writer derives: each part of the operator reports its *problem*
(the spec and children, the database, the schema, the workers; None when fine), and Ready
is False with the first problem's reason, Unknown until every part has reported once, and
True with the workers' summary otherwise.

Every field is reported as a `PoolStatus` (the model the CRD's status schema is generated
from) holding only the fields the reporter knows; the writer sends them by their wire names,
so a report cannot misspell a field or give it a value of the wrong type.

A status patch costs an API request and a watch event that kopf (and every other watcher
of pools) processes, so an idle pool must not write one every poll just because its
oldest message grew a few seconds older. The writer therefore tells *material* changes
from *drift*: a condition's status, reason or observed generation, a field first reported,
the replicas, the backlog's counts, the scale time and reason are written at once; the
backlog's ages, the rates and a condition's message alone are drift, written with the next
material change or once the last write is `heartbeat_seconds` old, whichever comes first.
An idle pool therefore writes its status about once per heartbeat (30 s by default, the
operator's `LEASEBOX_OPERATOR_STATUS_HEARTBEAT`), however short its poll interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from leasebox.store.backlog import Backlog
from leasebox_operator.conditions import READY, ConditionUpdate, apply, transitions
from leasebox_operator.models import BacklogStatus, PoolStatus, RatesStatus

PatchStatus = Callable[[dict[str, Any]], Awaitable[None]]
Problem = tuple[str, str]  # (reason, message)
# What Ready summarises, in order of precedence: the first problem found is the reason.
READY_PARTS = ("spec", "database", "schema", "workers")
_WAITING = {
    "spec": "the pool's children are being applied",
    "database": "waiting for the first backlog poll",
    "schema": "waiting for the first backlog poll",
    "workers": "waiting for the first backlog poll",
}
# Fields whose change alone is drift (see the module's docstring); `backlog` is drift only
# in its ages, its counts are material.
DRIFT_FIELDS = frozenset({"rates"})
DRIFT_BACKLOG_KEYS = frozenset({"oldestPendingAgeSeconds", "oldestReadyAgeSeconds"})
DEFAULT_HEARTBEAT_SECONDS = 30.0


def _material_field(name: str, old: Any, new: Any) -> bool:
    """Whether a field's change from `old` to `new` must be written at once."""
    if old is None:
        return True
    if name in DRIFT_FIELDS:
        return False
    if name == "backlog" and isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = (set(old) | set(new)) - DRIFT_BACKLOG_KEYS
        return any(old.get(k) != new.get(k) for k in keys)
    return True


def _material_conditions(
    before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]]
) -> bool:
    """Whether conditions differ in more than their messages."""

    def key(conditions: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
            for c in conditions
        ]

    return key(before) != key(after)


def backlog_status(backlog: Backlog) -> BacklogStatus:
    """The status `backlog` block; ages rounded so an idle pool does not churn."""
    return BacklogStatus(
        pending=backlog.pending,
        ready=backlog.ready,
        processing=backlog.processing,
        dead=backlog.dead,
        expired_leases=backlog.expired_leases,
        oldest_pending_age_seconds=int(backlog.oldest_pending_age_seconds),
        oldest_ready_age_seconds=int(backlog.oldest_ready_age_seconds),
    )


def rates_status(arrival_per_second: float, sent_per_second: float) -> RatesStatus:
    return RatesStatus(
        arrival_per_second=round(arrival_per_second, 2),
        sent_per_second=round(sent_per_second, 2),
    )


def combined(first: PoolStatus, *more: PoolStatus) -> PoolStatus:
    """One report of the fields each part sets (a later part wins)."""
    for part in more:
        first = first.model_copy(
            update={name: getattr(part, name) for name in part.model_fields_set}
        )
    return first


class StatusWriter:
    """The single writer of one pool's status."""

    def __init__(
        self,
        patch: PatchStatus,
        initial: Mapping[str, Any] | None = None,
        *,
        wallclock: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
    ) -> None:
        initial = dict(initial or {})
        self._patch = patch
        self._wallclock = wallclock
        self._clock = clock
        self.heartbeat_seconds = heartbeat_seconds
        self.written_at: float | None = None  # None: not yet written by this process
        self._lock = asyncio.Lock()
        self.conditions: list[dict[str, Any]] = [dict(c) for c in initial.pop("conditions", [])]
        self.fields: dict[str, Any] = initial
        self.problems: dict[str, Problem | None] = {}
        self.summary = "the pool works"

    def rebind(self, patch: PatchStatus) -> None:
        """Send later patches through `patch` (a handler's fresh API context)."""
        self._patch = patch

    async def write(
        self,
        status: PoolStatus | None = None,
        updates: Iterable[ConditionUpdate] = (),
        *,
        generation: int | None = None,
        problems: Mapping[str, Problem | None] | None = None,
        summary: str | None = None,
    ) -> list[tuple[str, str | None, str]]:
        """Patch the changed fields and conditions; return the condition transitions.

        `status` holds the fields to report (those it sets, a None it sets included); its
        conditions are ignored, as the writer keeps them. `problems` updates the parts Ready
        summarises; `summary` is Ready's message when nothing is wrong. Drift alone (see
        the module's docstring) is held back until the heartbeat is due.
        """
        async with self._lock:
            self.problems.update(problems or {})
            if summary is not None:
                self.summary = summary
            updates = [*updates, self.ready()]
            conditions = apply(
                self.conditions, updates, generation=generation, now=self._wallclock()
            )
            reported = (
                {}
                if status is None
                else status.model_dump(
                    mode="json", by_alias=True, exclude_unset=True, exclude={"conditions"}
                )
            )
            patch = {k: v for k, v in reported.items() if self.fields.get(k) != v}
            if conditions != self.conditions:
                patch["conditions"] = conditions
            if not patch:
                return []
            material = _material_conditions(self.conditions, conditions) or any(
                _material_field(k, self.fields.get(k), v)
                for k, v in patch.items()
                if k != "conditions"
            )
            now = self._clock()
            due = self.written_at is None or now - self.written_at >= self.heartbeat_seconds
            if not (material or due):
                return []
            await self._patch(patch)
            self.written_at = now
            changed = transitions(self.conditions, conditions)
            self.conditions = conditions
            self.fields.update({k: v for k, v in patch.items() if k != "conditions"})
            return changed

    def ready(self) -> ConditionUpdate:
        """The Ready condition the reported problems add up to."""
        for part in READY_PARTS:
            problem = self.problems.get(part)
            if problem is not None:
                return ConditionUpdate.of(READY, False, *problem)
        for part in READY_PARTS:
            if part not in self.problems:
                return ConditionUpdate.of(READY, None, "Pending", _WAITING[part])
        return ConditionUpdate.of(READY, True, "Available", self.summary)
