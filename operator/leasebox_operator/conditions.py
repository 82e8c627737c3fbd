"""Condition bookkeeping for the pool's status, shaped like `metav1.Condition`.

Conditions are how people and tools (kubectl wait, Argo CD health checks) read a pool's
state, so they follow the Kubernetes conventions exactly: one entry per type,
`lastTransitionTime` moves only when the status flips, and `observedGeneration` names the
spec the condition was computed from. The functions here are pure; the reconcile handler
and the poll loop both go through them, so the two never disagree on the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

READY = "Ready"
DATABASE_REACHABLE = "DatabaseReachable"
SLA_MET = "SLAMet"
SCALING_LIMITED = "ScalingLimited"
QUOTA_SUFFICIENT = "QuotaSufficient"
PAUSED = "Paused"
# Whether the pool's providers' bounce and complaint rates are under the page thresholds.
REPUTATION_HEALTHY = "ReputationHealthy"
CONDITION_TYPES = (
    READY,
    DATABASE_REACHABLE,
    SLA_MET,
    SCALING_LIMITED,
    QUOTA_SUFFICIENT,
    PAUSED,
    REPUTATION_HEALTHY,
)

Status = Literal["True", "False", "Unknown"]
MAX_MESSAGE = 1024


def rfc3339(moment: datetime) -> str:
    """A `metav1.Time`: UTC, second precision, `Z` suffix."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def whole_second(moment: datetime) -> datetime:
    """`moment` in UTC to the second: what a model writes as a `metav1.Time` (`rfc3339`)."""
    return moment.astimezone(UTC).replace(microsecond=0)


def status_of(value: bool | None) -> Status:
    return "Unknown" if value is None else ("True" if value else "False")


@dataclass(frozen=True)
class ConditionUpdate:
    """What one piece of code observed about one condition type."""

    type: str
    status: Status
    reason: str
    message: str

    @classmethod
    def of(cls, type_: str, value: bool | None, reason: str, message: str) -> ConditionUpdate:
        return cls(type_, status_of(value), reason, message)


def find(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    """The condition of `type_`, or None."""
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: Iterable[Mapping[str, Any]], type_: str) -> bool | None:
    """True/False for a known status, None when absent or Unknown."""
    found = find(conditions, type_)
    if found is None or found.get("status") == "Unknown":
        return None
    return bool(found.get("status") == "True")


def _order(condition: Mapping[str, Any]) -> tuple[int, str]:
    name = str(condition.get("type", ""))
    known = CONDITION_TYPES.index(name) if name in CONDITION_TYPES else len(CONDITION_TYPES)
    return known, name


def apply(
    conditions: Sequence[Mapping[str, Any]],
    updates: Iterable[ConditionUpdate],
    *,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """The conditions after `updates`, in a stable order; the input is not modified."""
    by_type = {str(c.get("type")): dict(c) for c in conditions if c.get("type")}
    for update in updates:
        previous = by_type.get(update.type)
        flipped = previous is None or previous.get("status") != update.status
        entry: dict[str, Any] = {
            "type": update.type,
            "status": update.status,
            "reason": update.reason,
            "message": update.message[:MAX_MESSAGE],
            "lastTransitionTime": (
                rfc3339(now)
                if flipped or previous is None
                else previous.get("lastTransitionTime", rfc3339(now))
            ),
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        by_type[update.type] = entry
    return sorted(by_type.values(), key=_order)


def transitions(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str | None, str]]:
    """(type, old status or None, new status) for every condition whose status changed."""
    changed = []
    for condition in after:
        old = find(before, str(condition["type"]))
        old_status = None if old is None else str(old.get("status"))
        if old_status != condition["status"]:
            changed.append((str(condition["type"]), old_status, str(condition["status"])))
    return changed
