"""One poll of one pool: backlog -> scaling policy -> replicas, status, Events, metrics.

This is the orchestration between the pure policy (`leasebox.scaling.policy.decide`) and the
outside world, which reaches it only through two small ports: `BacklogSource` (the one
indexed backlog query) and `PoolKube` (the Deployment, the status, Events). Clocks are
injected too, so the whole loop is tested with fakes and no sleeping. A failed backlog
read never touches the replicas: the pool keeps what it has, says so in a condition and
an Event, and the caller waits a growing delay before the next try.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from leasebox.scaling import policy as scaling
from leasebox.store.backlog import Backlog
from leasebox_operator.conditions import (
    DATABASE_REACHABLE,
    PAUSED,
    SCALING_LIMITED,
    SLA_MET,
    ConditionUpdate,
    rfc3339,
)
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.models import PoolSpec
from leasebox_operator.status import StatusWriter, backlog_status, rates_status

logger = logging.getLogger(__name__)


class PollError(Exception):
    """The backlog could not be read; `reason` is a condition reason, `message` is safe."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class DeploymentState:
    """The worker Deployment as the poll sees it."""

    replicas: int
    ready_replicas: int


class BacklogSource(Protocol):
    async def fetch(self, spec: PoolSpec, window_seconds: float) -> Backlog:
        """The pool's backlog; raises `PollError` when it cannot be read."""


class PoolKube(Protocol):
    async def read_deployment(self) -> DeploymentState | None: ...

    async def scale(self, replicas: int) -> None: ...

    def event(self, type_: str, reason: str, message: str) -> None: ...


def rate_window(poll_interval_seconds: float) -> float:
    """The window of the send rate and of the arrival estimate: a few polls, 5 s to 60 s."""
    return min(60.0, max(5.0, 3 * poll_interval_seconds))


def scaling_spec(spec: PoolSpec) -> scaling.ScalingSpec:
    """The policy's view of a pool spec."""
    s = spec.scaling
    return scaling.ScalingSpec(
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        sla_seconds=spec.sla.oldest_pending_age_seconds,
        poll_interval_seconds=s.poll_interval_seconds,
        scale_down_stabilization_seconds=s.scale_down_stabilization_seconds,
        max_scale_up_step=s.max_scale_up_step,
        max_scale_down_step=s.max_scale_down_step,
        initial_worker_throughput=s.initial_worker_throughput,
        startup_seconds=s.startup_seconds,
        backlog_budget_fraction=s.backlog_budget_fraction,
        rate_window_seconds=rate_window(s.poll_interval_seconds),
    )


class ArrivalEstimator:
    """Arrivals = sends + growth of the pending count, over about one rate window.

    The backlog query counts rows, not arrivals; what entered is what left plus what
    piled up. The growth is taken against the newest sample at least a window old and
    spread over at least a window, so one bulk insert reads as a burst averaged over the
    window, not as a rate a hundred times too high (also right after start-up).
    """

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def update(self, now: float, pending: int, sent_per_second: float, window: float) -> float:
        while len(self._samples) > 1 and now - self._samples[1][0] >= window:
            self._samples.popleft()
        estimate = sent_per_second
        if self._samples and now > self._samples[0][0]:
            then, before = self._samples[0]
            estimate += (pending - before) / max(now - then, window)
        self._samples.append((now, pending))
        return max(0.0, estimate)


def backoff_delay(failures: int, interval: float, ceiling: float) -> float:
    """Wait after `failures` consecutive failed polls: the interval, doubling, capped."""
    return float(min(ceiling, interval * 2 ** max(0, failures - 1)))


class PoolPoller:
    """Polls one pool; keeps the policy history and the arrival samples between polls."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        kube: PoolKube,
        source: BacklogSource,
        status: StatusWriter,
        metrics: OperatorMetrics,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_backoff_seconds: float = 60.0,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.kube = kube
        self.source = source
        self.status = status
        self.metrics = metrics
        self.clock = clock
        self.wallclock = wallclock
        self.max_backoff_seconds = max_backoff_seconds
        self.policy = scaling.PolicyState()
        self.arrivals = ArrivalEstimator()
        self.failures = 0
        self.deployment_missing = False

    async def poll_once(self, spec: PoolSpec, generation: int | None) -> float:
        """Poll once; return the seconds to wait before the next poll."""
        started = self.clock()
        interval = spec.scaling.poll_interval_seconds
        self.metrics.observe_spec(
            self.namespace,
            self.name,
            sla=spec.sla.oldest_pending_age_seconds,
            min_replicas=spec.scaling.min_replicas,
            max_replicas=spec.scaling.max_replicas,
            paused=spec.paused,
        )
        window = rate_window(interval)
        try:
            backlog = await self.source.fetch(spec, window)
        except PollError as exc:
            return await self._failed(exc, interval, generation)
        deployment = await self.kube.read_deployment()
        self.deployment_missing = deployment is None
        now = self.clock()
        arrival = self.arrivals.update(now, backlog.pending, backlog.sent_per_second, window)
        self.metrics.observe_backlog(self.namespace, self.name, backlog, arrival_per_second=arrival)
        fields: dict[str, Any] = {
            "backlog": backlog_status(backlog),
            "rates": rates_status(arrival, backlog.sent_per_second),
        }
        updates = [self._reachable(), self._sla(spec, backlog), self._paused(spec)]
        if deployment is not None:
            fields.update(await self._scale(spec, backlog, deployment, now, arrival, updates))
        changed = await self.status.write(fields, updates, generation=generation)
        self._announce(changed, spec, backlog)
        self.failures = 0
        self.metrics.poll_duration.observe(max(0.0, self.clock() - started))
        return interval

    async def _scale(
        self,
        spec: PoolSpec,
        backlog: Backlog,
        deployment: DeploymentState,
        now: float,
        arrival: float,
        updates: list[ConditionUpdate],
    ) -> dict[str, Any]:
        current = deployment.replicas
        if not self.policy.recommendations:
            # A (re)started operator has no history: count the running replicas as a
            # recommendation, so that a restart never scales a pool down before a window.
            self.policy = replace(self.policy, recommendations=((now, current),))
        observation = scaling.Observation(
            now=now,
            ready=backlog.ready,
            pending=backlog.pending,
            oldest_ready_age_seconds=backlog.oldest_ready_age_seconds,
            oldest_pending_age_seconds=backlog.oldest_pending_age_seconds,
            arrival_per_second=arrival,
            sent_per_second=backlog.sent_per_second,
            replicas=current,
            ready_replicas=min(deployment.ready_replicas, current),
        )
        decision = scaling.decide(observation, scaling_spec(spec), self.policy)
        self.policy = decision.state
        fields: dict[str, Any] = {"desiredReplicas": decision.replicas}
        replicas = current
        if not spec.paused and decision.replicas != current:
            await self.kube.scale(decision.replicas)
            replicas = decision.replicas
            self.metrics.scaled(self.namespace, self.name, current, replicas)
            self.kube.event(
                "Normal", "ScaledUp" if replicas > current else "ScaledDown", decision.reason
            )
            logger.info("pool %s/%s: %s", self.namespace, self.name, decision.reason)
            fields["lastScaleTime"] = rfc3339(self.wallclock())
            fields["lastScaleReason"] = decision.reason
        fields["replicas"] = replicas
        fields["readyReplicas"] = deployment.ready_replicas
        self.metrics.observe_replicas(
            self.namespace,
            self.name,
            replicas=replicas,
            ready=deployment.ready_replicas,
            desired=decision.replicas,
        )
        if spec.paused:
            updates.append(
                ConditionUpdate.of(
                    SCALING_LIMITED, False, "Paused", "the pool is paused; replicas are frozen"
                )
            )
        elif decision.limited:
            updates.append(
                ConditionUpdate.of(SCALING_LIMITED, True, "LimitReached", decision.reason)
            )
        else:
            updates.append(
                ConditionUpdate.of(
                    SCALING_LIMITED,
                    False,
                    "WithinLimits",
                    f"{decision.replicas} replicas is within {spec.scaling.min_replicas}"
                    f"..{spec.scaling.max_replicas}",
                )
            )
        return fields

    async def _failed(self, exc: PollError, interval: float, generation: int | None) -> float:
        self.failures += 1
        self.metrics.poll_failed(self.namespace, self.name)
        delay = backoff_delay(self.failures, interval, max(interval, self.max_backoff_seconds))
        changed = await self.status.write(
            {},
            [ConditionUpdate.of(DATABASE_REACHABLE, False, exc.reason, exc.message)],
            generation=generation,
        )
        if any(kind == DATABASE_REACHABLE for kind, _, _ in changed):
            self.kube.event(
                "Warning",
                "DatabaseUnreachable",
                f"{exc.message}; replicas kept, retrying with backoff",
            )
        logger.warning(
            "pool %s/%s: backlog poll failed (%s): %s; next try in %.1fs",
            self.namespace,
            self.name,
            exc.reason,
            exc.message,
            delay,
        )
        return delay

    @staticmethod
    def _reachable() -> ConditionUpdate:
        return ConditionUpdate.of(
            DATABASE_REACHABLE, True, "BacklogRead", "the backlog query succeeded"
        )

    @staticmethod
    def _sla(spec: PoolSpec, backlog: Backlog) -> ConditionUpdate:
        sla = spec.sla.oldest_pending_age_seconds
        age = backlog.oldest_pending_age_seconds
        met = age <= sla
        return ConditionUpdate.of(
            SLA_MET,
            met,
            "WithinSLA" if met else "SLAExceeded",
            f"oldest pending message is {age:.0f}s old; SLA {sla:g}s",
        )

    @staticmethod
    def _paused(spec: PoolSpec) -> ConditionUpdate:
        if spec.paused:
            return ConditionUpdate.of(
                PAUSED, True, "PausedBySpec", "spec.paused is true: replicas are frozen"
            )
        return ConditionUpdate.of(PAUSED, False, "Active", "the operator scales the pool")

    def _announce(
        self, changed: list[tuple[str, str | None, str]], spec: PoolSpec, backlog: Backlog
    ) -> None:
        """Events for condition flips people act on (not for the first observation)."""
        for kind, old, new in changed:
            if old is None:
                continue
            if kind == DATABASE_REACHABLE and new == "True":
                self.kube.event("Normal", "DatabaseReachable", "the backlog is readable again")
            elif kind == SLA_MET:
                sla = spec.sla.oldest_pending_age_seconds
                age = backlog.oldest_pending_age_seconds
                if new == "False":
                    self.kube.event(
                        "Warning",
                        "SLAExceeded",
                        f"oldest pending message is {age:.0f}s old, SLA {sla:g}s",
                    )
                else:
                    self.kube.event("Normal", "SLAMet", f"oldest pending within {sla:g}s again")
            elif kind == PAUSED:
                self.kube.event(
                    "Normal",
                    "Paused" if new == "True" else "Resumed",
                    "replicas frozen" if new == "True" else "scaling resumed",
                )
