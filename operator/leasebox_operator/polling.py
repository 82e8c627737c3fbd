"""One poll of one pool: backlog -> scaling policy -> replicas, status, Events, metrics.

This is the orchestration between the pure policy (`leasebox.scaling.policy.decide`) and the
outside world, which reaches it only through two small ports: `BacklogSource` (the schema
check and the one indexed backlog query) and `PoolKube` (the Deployment, Events). Clocks
are injected too, so the whole loop is tested with fakes and no sleeping. A failed
backlog read never touches the replicas: the pool keeps what it has, says so in a
condition and an Event, and the caller waits a growing delay before the next try. In
scaling mode External the replicas come from `spec.replicas` (an HPA's or `kubectl
scale`'s), kept within min/max; everything else is observed and reported the same. A paused
pool (`spec.paused`) is scaled to zero workers and held there whatever its backlog or mode,
deleting nothing; resuming hands it back to the policy (or to `spec.replicas`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from leasebox.scaling import policy as scaling
from leasebox.scaling.quota import QuotaOutlook
from leasebox.store.backlog import Backlog
from leasebox.store.reputation import Verdict
from leasebox_operator.conditions import (
    DATABASE_REACHABLE,
    PAUSED,
    QUOTA_SUFFICIENT,
    REPUTATION_HEALTHY,
    SCALING_LIMITED,
    SLA_MET,
    ConditionUpdate,
    whole_second,
)
from leasebox_operator.errors import PollError, PoolProblem
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.models import PoolSpec, PoolStatus
from leasebox_operator.status import (
    Problem,
    StatusWriter,
    backlog_status,
    combined,
    rates_status,
)

__all__ = ["BacklogSource", "DeploymentState", "PollError", "PoolKube", "PoolPoller"]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeploymentState:
    """The worker Deployment as the poll sees it."""

    replicas: int
    ready_replicas: int
    available_replicas: int = 0


class BacklogSource(Protocol):
    async def check_schema(self, spec: PoolSpec) -> PoolProblem | None:
        """SchemaMissing or SchemaOutdated, or None; raises `PollError` when unreachable."""

    async def fetch(self, spec: PoolSpec, window_seconds: float) -> Backlog:
        """The pool's backlog; raises `PollError` when it cannot be read."""

    async def reputation(self, spec: PoolSpec) -> Verdict | None:
        """The providers' reputation now and then (None: nothing new); never raises."""


class PoolKube(Protocol):
    async def read_deployment(self) -> DeploymentState | None: ...

    async def scale(self, replicas: int) -> None: ...

    async def event(self, type_: str, reason: str, message: str) -> None: ...


def workers_problem(deployment: DeploymentState) -> tuple[Problem | None, str]:
    """Ready's view of the workers: a problem when a pool that wants some has none."""
    wanted, available = deployment.replicas, deployment.available_replicas
    if wanted == 0:
        return None, "no workers wanted (the pool is idle at zero replicas)"
    if available == 0:
        return (
            "WorkersUnavailable",
            f"0 of {wanted} workers are available; see the worker Deployment's pods "
            "(image, init container, probes)",
        ), ""
    return None, f"{available} of {wanted} workers available"


def rate_window(poll_interval_seconds: float) -> float:
    """The window of the send rate and of the arrival estimate: a few polls, 5 s to 60 s."""
    return min(60.0, max(5.0, 3 * poll_interval_seconds))


def policy_config(spec: PoolSpec) -> scaling.PolicyConfig:
    """The policy's view of a pool spec."""
    s = spec.scaling
    return scaling.PolicyConfig(
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        sla_seconds=float(spec.sla.oldest_pending_age_seconds),
        poll_interval_seconds=float(s.poll_interval_seconds),
        scale_down_stabilization_seconds=float(s.scale_down_stabilization_seconds),
        max_scale_up_step=s.max_scale_up_step,
        max_scale_down_step=s.max_scale_down_step,
        initial_worker_throughput=float(s.initial_worker_throughput),
        startup_seconds=float(s.startup_seconds),
        backlog_budget_fraction=s.backlog_budget_percent / 100,
        rate_window_seconds=rate_window(s.poll_interval_seconds),
        quota_per_second=None if spec.provider.quota is None else spec.provider.quota.per_second,
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
        self.last_poll: float | None = None
        self.schema_reason: str | None = None
        self.quota_outlook: QuotaOutlook | None = None

    async def poll_once(self, spec: PoolSpec, generation: int | None) -> float:
        """Poll once; return the seconds to wait before the next poll."""
        started = self.clock()
        interval = float(spec.scaling.poll_interval_seconds)
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
            schema = await self.source.check_schema(spec)
            backlog = (
                None
                if schema and schema.reason == "SchemaMissing"
                else (await self.source.fetch(spec, window))
            )
        except PollError as exc:
            return await self._failed(exc, interval, generation)
        await self._announce_schema(schema)
        deployment = await self.kube.read_deployment()
        self.deployment_missing = deployment is None
        status = PoolStatus(kinds=", ".join(spec.kinds))
        updates = [self._reachable(), self._paused(spec)]
        problems: dict[str, Problem | None] = {
            "database": None,
            "schema": None if schema is None else (schema.reason, schema.message),
        }
        summary = None
        if backlog is not None:
            now = self.clock()
            arrival = self.arrivals.update(now, backlog.pending, backlog.sent_per_second, window)
            arrived = 0.0 if self.last_poll is None else arrival * (now - self.last_poll)
            self.last_poll = now
            self.metrics.observe_backlog(self.namespace, self.name, backlog, arrived=arrived)
            status = combined(
                status,
                PoolStatus(
                    backlog=backlog_status(backlog),
                    rates=rates_status(arrival, backlog.sent_per_second),
                ),
            )
            updates.append(self._sla(spec, backlog))
            verdict = await self.source.reputation(spec)
            if verdict is not None:
                updates.append(
                    ConditionUpdate.of(
                        REPUTATION_HEALTHY, verdict.healthy, verdict.reason, verdict.message
                    )
                )
            if deployment is not None:
                scaled = await self._scale(spec, backlog, deployment, now, arrival, updates)
                status = combined(status, scaled)
        elif deployment is not None:
            status = combined(status, await self._migrate_from_zero(spec, deployment))
        if deployment is not None:
            status = combined(status, PoolStatus(ready_replicas=deployment.ready_replicas))
            replicas = deployment.replicas if status.replicas is None else status.replicas
            problems["workers"], summary = workers_problem(replace(deployment, replicas=replicas))
            if spec.paused:
                summary = "paused: the workers are held at 0 replicas"
        changed = await self.status.write(
            status, updates, generation=generation, problems=problems, summary=summary
        )
        await self._announce(changed, spec, backlog)
        self.failures = 0
        self.metrics.poll_duration.observe(max(0.0, self.clock() - started))
        return interval

    async def _migrate_from_zero(self, spec: PoolSpec, deployment: DeploymentState) -> PoolStatus:
        """A missing schema that the workers migrate needs one worker to migrate it."""
        if spec.database.migrations != "Auto" or spec.paused or deployment.replicas > 0:
            return PoolStatus(replicas=deployment.replicas)
        reason = "scale up 0→1: the schema is missing and the workers' init container migrates it"
        await self.kube.scale(1)
        await self.kube.event("Normal", "ScaledUp", reason)
        return PoolStatus(
            replicas=1, last_scale_time=whole_second(self.wallclock()), last_scale_reason=reason
        )

    def _target(
        self,
        spec: PoolSpec,
        backlog: Backlog,
        deployment: DeploymentState,
        now: float,
        arrival: float,
    ) -> tuple[int, str, bool, QuotaOutlook | None]:
        """(replicas, reason, limited, quota outlook): the policy's in mode Operator,
        spec.replicas' else (the quota outlook is the policy's either way)."""
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
        decision = scaling.decide(observation, policy_config(spec), self.policy)
        self.policy = decision.state
        if spec.scaling.mode == "Operator":
            return decision.replicas, decision.reason, decision.limited, decision.quota
        wanted = current if spec.replicas is None else spec.replicas
        low, high = spec.scaling.min_replicas, spec.scaling.max_replicas
        target = max(low, min(high, wanted))
        direction = "up" if target > current else "down"
        reason = f"scale {direction} {current}→{target}: spec.replicas is {wanted} (mode External)"
        if target != wanted:
            reason += f", kept within {low}..{high}"
        return target, reason, target != wanted, decision.quota

    async def _scale(
        self,
        spec: PoolSpec,
        backlog: Backlog,
        deployment: DeploymentState,
        now: float,
        arrival: float,
        updates: list[ConditionUpdate],
    ) -> PoolStatus:
        current = deployment.replicas
        target, reason, limited, outlook = self._target(spec, backlog, deployment, now, arrival)
        self.quota_outlook = outlook
        updates.append(self._quota(outlook))
        self.metrics.observe_quota(
            self.namespace,
            self.name,
            None if outlook is None else outlook.quota_per_second,
            None if outlook is None else outlook.seconds_to_breach,
        )
        if spec.paused:
            # Paused: the workers go to zero and stay there; nothing is deleted, and the
            # policy keeps observing, so that resuming starts from what it has seen.
            target, limited = 0, False
            reason = f"scale down {current}→0: spec.paused is true"
        status = PoolStatus(desired_replicas=target)
        replicas = current
        if target != current:
            await self.kube.scale(target)
            replicas = target
            self.metrics.scaled(self.namespace, self.name, current, replicas)
            await self.kube.event(
                "Normal", "ScaledUp" if target > current else "ScaledDown", reason
            )
            logger.info("pool %s/%s: %s", self.namespace, self.name, reason)
            status = combined(
                status,
                PoolStatus(
                    last_scale_time=whole_second(self.wallclock()), last_scale_reason=reason
                ),
            )
        status = combined(status, PoolStatus(replicas=replicas))
        self.metrics.observe_replicas(
            self.namespace,
            self.name,
            replicas=replicas,
            ready=deployment.ready_replicas,
            desired=target,
        )
        if spec.paused:
            updates.append(
                ConditionUpdate.of(
                    SCALING_LIMITED, False, "Paused", "the pool is paused; workers held at 0"
                )
            )
        elif limited:
            updates.append(ConditionUpdate.of(SCALING_LIMITED, True, "LimitReached", reason))
        else:
            updates.append(
                ConditionUpdate.of(
                    SCALING_LIMITED,
                    False,
                    "WithinLimits",
                    f"{target} replicas is within {spec.scaling.min_replicas}"
                    f"..{spec.scaling.max_replicas}",
                )
            )
        return status

    async def _failed(self, exc: PollError, interval: float, generation: int | None) -> float:
        self.failures += 1
        self.metrics.poll_failed(self.namespace, self.name)
        delay = backoff_delay(self.failures, interval, max(interval, self.max_backoff_seconds))
        changed = await self.status.write(
            None,
            [ConditionUpdate.of(DATABASE_REACHABLE, False, exc.reason, exc.message)],
            generation=generation,
            problems={"database": (exc.reason, exc.message)},
        )
        if any(kind == DATABASE_REACHABLE for kind, _, _ in changed):
            await self.kube.event(
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

    async def _announce_schema(self, schema: PoolProblem | None) -> None:
        """One Event when the schema becomes missing or outdated, one when it is fine again."""
        reason = None if schema is None else schema.reason
        if reason == self.schema_reason:
            return
        if schema is not None:
            await self.kube.event("Warning", schema.reason, schema.message)
        elif self.schema_reason is not None:
            await self.kube.event("Normal", "SchemaReady", "the leasebox schema is up to date")
        self.schema_reason = reason

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
            f"oldest pending message is {age:.0f}s old; SLA {sla}s",
        )

    @staticmethod
    def _quota(outlook: QuotaOutlook | None) -> ConditionUpdate:
        if outlook is None:
            return ConditionUpdate.of(
                QUOTA_SUFFICIENT, True, "NoQuota", "the pool has no provider quota"
            )
        reason = "WithinQuota" if outlook.sufficient else "ArrivalsAboveQuota"
        return ConditionUpdate.of(QUOTA_SUFFICIENT, outlook.sufficient, reason, outlook.message)

    @staticmethod
    def _paused(spec: PoolSpec) -> ConditionUpdate:
        if spec.paused:
            return ConditionUpdate.of(
                PAUSED,
                True,
                "PausedBySpec",
                "spec.paused is true: the workers are scaled to 0 and held there",
            )
        who = "the operator scales" if spec.scaling.mode == "Operator" else "spec.replicas sizes"
        return ConditionUpdate.of(PAUSED, False, "Active", f"{who} the pool")

    async def _announce(
        self, changed: list[tuple[str, str | None, str]], spec: PoolSpec, backlog: Backlog | None
    ) -> None:
        """Events for condition flips people act on (not for the first observation)."""
        for kind, old, new in changed:
            if old is None:
                continue
            if kind == DATABASE_REACHABLE and new == "True":
                await self.kube.event(
                    "Normal", "DatabaseReachable", "the backlog is readable again"
                )
            elif kind == SLA_MET and backlog is not None:
                sla = spec.sla.oldest_pending_age_seconds
                age = backlog.oldest_pending_age_seconds
                if new == "False":
                    await self.kube.event(
                        "Warning",
                        "SLAExceeded",
                        f"oldest pending message is {age:.0f}s old, SLA {sla}s",
                    )
                else:
                    await self.kube.event("Normal", "SLAMet", f"oldest pending within {sla}s again")
            elif kind == QUOTA_SUFFICIENT and self.quota_outlook is not None:
                if new == "False":
                    message = self.quota_outlook.message
                    await self.kube.event("Warning", "ArrivalsAboveQuota", message)
                else:
                    fits = "arrivals fit in the quota again"
                    await self.kube.event("Normal", "WithinQuota", fits)
            elif kind == REPUTATION_HEALTHY and new in ("True", "False"):
                at_risk = new == "False"
                await self.kube.event(
                    "Warning" if at_risk else "Normal",
                    "ReputationAtRisk" if at_risk else "ReputationHealthy",
                    "a provider's bounce or complaint rate is over its page threshold"
                    if at_risk
                    else "the providers' bounce and complaint rates are under the thresholds",
                )
            elif kind == PAUSED:
                await self.kube.event(
                    "Normal",
                    "Paused" if new == "True" else "Resumed",
                    "workers scaled to 0 and held there" if new == "True" else "scaling resumed",
                )
