"""A faithful model of a KEDA-driven HorizontalPodAutoscaler, the baseline of `simulate`.

A comparison with a hobbled baseline is worthless, so this follows the
Kubernetes controller (`pkg/controller/podautoscaler`) rule by rule rather than
approximating it: a 15 s sync; a 10 % tolerance; external `AverageValue`
metrics divided by the pods the Deployment has and `Value` metrics multiplied
by its *ready* pods; the default behaviour, whose scale-up is limited per 15 s
to the larger of +100 % and +4 pods counted from the replicas at the start of
the period, and whose scale-down takes the highest recommendation of the last
300 s. One step is a pure function of its inputs so tests can pin each rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["HpaSpec", "HpaState", "hpa_metric_replicas", "hpa_step"]

MetricName = Literal["backlog", "age"]
TargetType = Literal["AverageValue", "Value"]


@dataclass(frozen=True)
class HpaSpec:
    """One HPA, as KEDA would create it for a ScaledObject with one trigger.

    Attributes:
        metric: "backlog" (ready messages) or "age" (oldest ready age, seconds).
        target: the target value of the metric.
        target_type: "AverageValue" (per pod) or "Value" (for the whole pool).
        min_replicas: the HPA's minReplicas (KEDA's minReplicaCount when >= 1).
        max_replicas: the HPA's maxReplicas.
        tolerance: the controller's `--horizontal-pod-autoscaler-tolerance`.
        sync_period_seconds: the controller's `--horizontal-pod-autoscaler-sync-period`.
        scale_up_percent: default scale-up policy: percent added per period.
        scale_up_pods: default scale-up policy: pods added per period.
        scale_up_period_seconds: the period both scale-up policies count over.
        scale_down_stabilization_seconds: default scale-down stabilisation window.
        scale_down_percent: default scale-down policy: percent removed per period.
        scale_down_period_seconds: the period of the scale-down policy.
    """

    metric: MetricName
    target: float
    target_type: TargetType
    min_replicas: int = 1
    max_replicas: int = 50
    tolerance: float = 0.1
    sync_period_seconds: float = 15.0
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    scale_up_period_seconds: float = 15.0
    scale_down_stabilization_seconds: float = 300.0
    scale_down_percent: float = 100.0
    scale_down_period_seconds: float = 15.0

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ValueError(f"HPA target must be > 0, got {self.target}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"HPA needs 1 <= min_replicas ({self.min_replicas}) <= "
                f"max_replicas ({self.max_replicas})"
            )

    @property
    def label(self) -> str:
        """The setting as the comparison table names it."""
        return f"{self.metric} {self.target_type} {self.target:g}"


@dataclass(frozen=True)
class HpaState:
    """What the controller remembers between syncs.

    Attributes:
        recommendations: (time, replicas) computed from the metric, unstabilised.
        scale_events: (time, signed change) of the scalings it performed.
    """

    recommendations: tuple[tuple[float, int], ...] = ()
    scale_events: tuple[tuple[float, int], ...] = ()


def hpa_metric_replicas(
    spec: HpaSpec, value: float, current_replicas: int, ready_replicas: int
) -> int:
    """Replicas the metric asks for (`GetExternal[PerPod]MetricReplicas`), before behaviour."""
    if spec.target_type == "AverageValue":
        if current_replicas == 0:
            return math.ceil(value / spec.target)
        ratio = value / (spec.target * current_replicas)
        if abs(1.0 - ratio) <= spec.tolerance:
            return current_replicas
        return math.ceil(value / spec.target)
    ratio = value / spec.target
    if current_replicas == 0:
        return math.ceil(ratio)
    if abs(1.0 - ratio) <= spec.tolerance:
        return current_replicas
    return math.ceil(ratio * ready_replicas)


def _changed_within(events: tuple[tuple[float, int], ...], now: float, period: float) -> int:
    return sum(change for at, change in events if at > now - period)


def hpa_step(
    spec: HpaSpec,
    state: HpaState,
    now: float,
    value: float,
    current_replicas: int,
    ready_replicas: int,
) -> tuple[int, HpaState]:
    """One controller sync: the replicas it sets and its next memory."""
    desired = hpa_metric_replicas(spec, value, current_replicas, ready_replicas)

    window = spec.scale_down_stabilization_seconds
    kept = tuple((at, count) for at, count in state.recommendations if at > now - window)
    down_limit = max([desired, *(count for _, count in kept)])
    stabilised = min(max(current_replicas, desired), down_limit)

    added = _changed_within(
        tuple(e for e in state.scale_events if e[1] > 0), now, spec.scale_up_period_seconds
    )
    removed = -_changed_within(
        tuple(e for e in state.scale_events if e[1] < 0), now, spec.scale_up_period_seconds
    )
    target = stabilised
    if stabilised > current_replicas:
        start = current_replicas - added + removed
        up_limit = max(
            math.ceil(start * (1 + spec.scale_up_percent / 100)), start + spec.scale_up_pods
        )
        up_limit = max(up_limit, current_replicas)
        target = min(stabilised, up_limit, spec.max_replicas)
    elif stabilised < current_replicas:
        added_down = _changed_within(
            tuple(e for e in state.scale_events if e[1] > 0), now, spec.scale_down_period_seconds
        )
        removed_down = -_changed_within(
            tuple(e for e in state.scale_events if e[1] < 0), now, spec.scale_down_period_seconds
        )
        start = current_replicas - added_down + removed_down
        down_floor = int(start * (1 - spec.scale_down_percent / 100))
        target = max(stabilised, down_floor, spec.min_replicas)
    target = max(spec.min_replicas, min(spec.max_replicas, target))

    events = tuple(
        (at, change)
        for at, change in state.scale_events
        if at > now - max(spec.scale_up_period_seconds, spec.scale_down_period_seconds)
    )
    if target != current_replicas:
        events += ((now, target - current_replicas),)
    return target, HpaState(recommendations=(*kept, (now, desired)), scale_events=events)
