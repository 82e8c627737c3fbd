"""How many workers a pool needs: the pure scaling policy.

The operator, `leasebox simulate` and the demo all call `decide`, so the figures a
simulation reports are the figures production gets. The function is pure (an
observation, the policy's config and the recent history in, a decision and the next history
out) because scaling mistakes are expensive to find in a cluster and cheap to
find in a property test.

The policy spends the SLA instead of hoarding it. It aims the *ready* backlog at
a budget (Little's law: arrival rate times a fraction of the SLA) and asks for
the capacity that brings the backlog back to that budget within a drain horizon
longer than a pod's start-up plus one poll, so that pods already starting count
as capacity and are not ordered twice. Messages waiting in backoff are not
demand. Per-worker throughput is measured only while workers are busy, because
measured over idle time it merely echoes the arrival rate. It scales up at once,
scales down only to the highest recommendation inside the stabilisation window,
and activates a pool at zero on any ready backlog.

A provider quota (`quota_per_second`: the account's send rate, which the workers share
through the database) changes two things. The pool is never scaled beyond the workers the
quota keeps busy (`ceil(quota / per-worker throughput)`): more would only wait for tokens.
And when messages arrive faster than the quota, no number of workers meets the SLA, so the
decision says when the backlog will pass it (`QuotaOutlook`) instead of adding pods. A
throughput sample taken while the pool sends at its quota measures the quota, not the
workers, and is not taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from leasebox.scaling.quota import AT_QUOTA, QuotaOutlook, quota_outlook

__all__ = [
    "Decision",
    "Demand",
    "Observation",
    "PolicyConfig",
    "PolicyState",
    "decide",
    "demand",
]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _finite(name: str, value: float) -> None:
    _require(math.isfinite(value), f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class PolicyConfig:
    """The settings of one pool's policy; every field is validated on construction.

    Attributes:
        min_replicas: fewest workers, 0 allows scale to zero.
        max_replicas: most workers; at least 1 and at least `min_replicas`.
        sla_seconds: the promise, as the oldest ready message's age.
        poll_interval_seconds: how often the caller observes and decides.
        scale_down_stabilization_seconds: a scale-down goes only to the highest
            recommendation made within this many seconds.
        max_scale_up_step: most pods added by one decision; None is unbounded.
        max_scale_down_step: most pods removed by one decision; None is unbounded.
        initial_worker_throughput: messages per second one worker sends, used
            until a throughput has been measured.
        startup_seconds: expected delay between asking for a pod and its first send.
        backlog_budget_fraction: the fraction of the SLA the ready backlog may
            spend waiting; the backlog aims at arrival rate times this much SLA.
        drain_horizon_seconds: the time allowed to bring the backlog back to its
            budget. It must exceed start-up plus one poll, or every poll orders
            the capacity still starting again. None: the larger of the backlog's
            SLA share and start-up plus two polls.
        throughput_smoothing: weight of a new per-worker throughput sample in
            the moving average, in (0, 1].
        rate_window_seconds: the window over which the observation's send rate
            is measured. Workers count as busy, and a throughput sample is taken,
            only when the oldest ready message is at least this old: a message
            then waited throughout the window, so no worker was idle in it.
            None: the poll interval.
        min_throughput_fraction: the measured per-worker throughput is taken as
            at least this fraction of `initial_worker_throughput`. Workers that
            barely send (a provider outage) are not helped by more workers, and
            dividing by a near-zero rate would send every pool to its maximum.
        quota_per_second: the provider account's send quota, shared by the pool's
            workers (None: no quota). The pool gets no more workers than the quota keeps
            busy, and a decision says when arrivals above it will breach the SLA.
    """

    min_replicas: int = 0
    max_replicas: int = 10
    sla_seconds: float = 60.0
    poll_interval_seconds: float = 5.0
    scale_down_stabilization_seconds: float = 120.0
    max_scale_up_step: int | None = None
    max_scale_down_step: int | None = None
    initial_worker_throughput: float = 50.0
    startup_seconds: float = 20.0
    backlog_budget_fraction: float = 0.5
    drain_horizon_seconds: float | None = None
    throughput_smoothing: float = 0.3
    rate_window_seconds: float | None = None
    min_throughput_fraction: float = 0.1
    quota_per_second: float | None = None

    def __post_init__(self) -> None:
        _require(self.min_replicas >= 0, f"min_replicas must be >= 0, got {self.min_replicas}")
        _require(self.max_replicas >= 1, f"max_replicas must be >= 1, got {self.max_replicas}")
        _require(
            self.min_replicas <= self.max_replicas,
            f"min_replicas ({self.min_replicas}) must not exceed "
            f"max_replicas ({self.max_replicas})",
        )
        for name in ("sla_seconds", "poll_interval_seconds", "initial_worker_throughput"):
            value = getattr(self, name)
            _finite(name, value)
            _require(value > 0, f"{name} must be > 0, got {value}")
        for name in ("scale_down_stabilization_seconds", "startup_seconds"):
            value = getattr(self, name)
            _finite(name, value)
            _require(value >= 0, f"{name} must be >= 0, got {value}")
        for name in ("max_scale_up_step", "max_scale_down_step"):
            step = getattr(self, name)
            _require(step is None or step >= 1, f"{name} must be None or >= 1, got {step}")
        _finite("backlog_budget_fraction", self.backlog_budget_fraction)
        _require(
            0 < self.backlog_budget_fraction < 1,
            f"backlog_budget_fraction must be in (0, 1), got {self.backlog_budget_fraction}",
        )
        _finite("throughput_smoothing", self.throughput_smoothing)
        _require(
            0 < self.throughput_smoothing <= 1,
            f"throughput_smoothing must be in (0, 1], got {self.throughput_smoothing}",
        )
        _finite("min_throughput_fraction", self.min_throughput_fraction)
        _require(
            0 < self.min_throughput_fraction <= 1,
            f"min_throughput_fraction must be in (0, 1], got {self.min_throughput_fraction}",
        )
        if self.drain_horizon_seconds is not None:
            floor = self.startup_seconds + self.poll_interval_seconds
            _finite("drain_horizon_seconds", self.drain_horizon_seconds)
            _require(
                self.drain_horizon_seconds > floor,
                f"drain_horizon_seconds ({self.drain_horizon_seconds}) must exceed start-up "
                f"plus one poll ({floor}), or starting pods are ordered again every poll",
            )
        if self.quota_per_second is not None:
            _finite("quota_per_second", self.quota_per_second)
            _require(
                self.quota_per_second > 0,
                f"quota_per_second must be > 0, got {self.quota_per_second}",
            )
        if self.rate_window_seconds is not None:
            _finite("rate_window_seconds", self.rate_window_seconds)
            _require(
                self.rate_window_seconds > 0,
                f"rate_window_seconds must be > 0, got {self.rate_window_seconds}",
            )

    @property
    def drain_horizon(self) -> float:
        """The drain horizon in seconds, with the default resolved."""
        if self.drain_horizon_seconds is not None:
            return self.drain_horizon_seconds
        return max(
            self.backlog_budget_fraction * self.sla_seconds,
            self.startup_seconds + 2 * self.poll_interval_seconds,
        )

    @property
    def rate_window(self) -> float:
        """The send-rate window in seconds, with the default resolved."""
        return self.rate_window_seconds or self.poll_interval_seconds


@dataclass(frozen=True)
class Observation:
    """One poll's view of a pool; counts and rates must be finite and non-negative.

    Attributes:
        now: seconds on any monotonic clock; only differences matter.
        ready: pending rows claimable now.
        pending: all pending rows, including those waiting in backoff.
        oldest_ready_age_seconds: age (from creation) of the oldest ready row, 0 when none.
        oldest_pending_age_seconds: age of the oldest pending row, 0 when none.
        arrival_per_second: rows created per second, recently.
        sent_per_second: rows sent per second over the policy's rate window.
        replicas: replicas currently requested on the Deployment.
        ready_replicas: pods running and ready; `replicas - ready_replicas` are starting.
    """

    now: float
    ready: int
    pending: int
    oldest_ready_age_seconds: float
    oldest_pending_age_seconds: float
    arrival_per_second: float
    sent_per_second: float
    replicas: int
    ready_replicas: int

    def __post_init__(self) -> None:
        _finite("now", self.now)
        for name in (
            "ready",
            "pending",
            "oldest_ready_age_seconds",
            "oldest_pending_age_seconds",
            "arrival_per_second",
            "sent_per_second",
            "replicas",
            "ready_replicas",
        ):
            value = getattr(self, name)
            _finite(name, value)
            _require(value >= 0, f"observation {name} must be >= 0, got {value}")


@dataclass(frozen=True)
class PolicyState:
    """The recent history one decision hands to the next.

    Attributes:
        recommendations: (time, replicas) recommended within the stabilisation
            window, oldest first.
        worker_throughput: measured messages per second of one busy worker (a
            moving average), None until the first busy poll.
        last_scale_at: when the policy last changed the replica count.
    """

    recommendations: tuple[tuple[float, int], ...] = ()
    worker_throughput: float | None = None
    last_scale_at: float | None = None


@dataclass(frozen=True)
class Demand:
    """What the backlog asks for, before limits; the figures a reason quotes.

    Attributes:
        workers: recommended replicas before min/max replicas and step limits.
        term: the term that drove it: "rate", "drain", "activation" or "idle".
        rate_workers: workers needed to keep up with arrivals.
        drain_workers: workers (negative when under budget) that bring the
            ready backlog to its budget within the drain horizon.
        budget: the ready backlog the policy aims at, in messages.
        worker_throughput: the per-worker throughput used, messages per second.
    """

    workers: int
    term: str
    rate_workers: float
    drain_workers: float
    budget: float
    worker_throughput: float


@dataclass(frozen=True)
class Decision:
    """The replicas to request and why.

    Attributes:
        replicas: the replica count to request.
        reason: one sentence naming direction, old→new, the figures and the term.
        limited: the recommendation was clipped by min/max replicas or a step limit.
        state: the history to pass to the next call.
        quota: what the quota means for the SLA (None: the pool has no quota).
    """

    replicas: int
    reason: str
    limited: bool
    state: PolicyState = field(repr=False)
    quota: QuotaOutlook | None = None


def _measure(observation: Observation, config: PolicyConfig, state: PolicyState) -> float | None:
    """Fold a per-worker throughput sample into the average, only when workers were busy
    (sending as fast as they could, not waiting for the quota's tokens)."""
    busy = (
        observation.ready > 0
        and observation.ready_replicas > 0
        and observation.oldest_ready_age_seconds >= config.rate_window
    )
    quota = config.quota_per_second
    if quota is not None and observation.sent_per_second >= AT_QUOTA * quota:
        busy = False
    if not busy:
        return state.worker_throughput
    sample = observation.sent_per_second / observation.ready_replicas
    if sample <= 0:
        return state.worker_throughput
    if state.worker_throughput is None:
        return sample
    weight = config.throughput_smoothing
    return weight * sample + (1 - weight) * state.worker_throughput


def demand(observation: Observation, config: PolicyConfig, worker_throughput: float) -> Demand:
    """The replicas the ready backlog needs, before min/max replicas and step limits."""
    arrival = observation.arrival_per_second
    budget = arrival * config.backlog_budget_fraction * config.sla_seconds
    rate_workers = arrival / worker_throughput
    drain_workers = (observation.ready - budget) / (config.drain_horizon * worker_throughput)
    needed = rate_workers + drain_workers
    workers = max(0, math.ceil(needed - 1e-9))
    if workers == 0 and observation.ready > 0:
        term = "activation"
        workers = 1
    elif needed <= 0:
        term = "idle"
    elif drain_workers >= rate_workers:
        term = "drain"
    else:
        term = "rate"
    return Demand(workers, term, rate_workers, drain_workers, budget, worker_throughput)


def _figures(observation: Observation, config: PolicyConfig, wanted: Demand) -> str:
    return (
        f"oldest ready {observation.oldest_ready_age_seconds:.0f}s of "
        f"{config.sla_seconds:.0f}s SLA, backlog {observation.ready} "
        f"(budget {wanted.budget:.0f}), {wanted.worker_throughput:.1f} msg/s per worker, "
        f"{wanted.term} term"
    )


def _clip(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def decide(observation: Observation, config: PolicyConfig, state: PolicyState) -> Decision:
    """Decide the replicas for one poll of one pool."""
    now = observation.now
    current = observation.replicas
    throughput = _measure(observation, config, state)
    floor = config.min_throughput_fraction * config.initial_worker_throughput
    per_worker = max(floor, throughput or config.initial_worker_throughput)
    wanted = demand(observation, config, per_worker)
    outlook = quota_outlook(
        config.quota_per_second,
        arrival=observation.arrival_per_second,
        ready=observation.ready,
        oldest_pending_age=observation.oldest_pending_age_seconds,
        sla_seconds=config.sla_seconds,
        worker_throughput=per_worker,
    )
    busy = wanted.workers if outlook is None else min(wanted.workers, outlook.workers)
    recommendation = _clip(busy, config.min_replicas, config.max_replicas)
    limited = recommendation != wanted.workers
    notes: list[str] = []
    if recommendation < busy:
        notes.append(f"capped at max replicas {config.max_replicas}")
    elif recommendation > busy:
        notes.append(f"raised to min replicas {config.min_replicas}")
    if outlook is not None and busy < wanted.workers:
        notes.append(
            f"capped at the {outlook.workers} workers the quota of "
            f"{outlook.quota_per_second:g}/s keeps busy"
        )

    window = config.scale_down_stabilization_seconds
    kept = [(at, count) for at, count in state.recommendations if now - window < at <= now]
    recent = (*kept, (now, recommendation))
    highest = min(config.max_replicas, max(count for _, count in recent))
    figures = _figures(observation, config, wanted)

    target = current
    if recommendation > current:
        target = recommendation
        if config.max_scale_up_step is not None and target - current > config.max_scale_up_step:
            # The replica bounds outrank the step: a pool below its minimum goes straight to it.
            target = max(current + config.max_scale_up_step, config.min_replicas)
            limited = True
            notes.append(f"step limited to +{config.max_scale_up_step}")
        reason = f"scale up {current}→{target}: {figures}"
    elif highest < current:
        target = highest
        if config.max_scale_down_step is not None and current - target > config.max_scale_down_step:
            target = min(current - config.max_scale_down_step, config.max_replicas)
            limited = True
            notes.append(f"step limited to -{config.max_scale_down_step}")
        reason = (
            f"scale down {current}→{target}: highest recommendation in the last "
            f"{window:.0f}s is {highest}; {figures}"
        )
    elif recommendation < current:
        reason = (
            f"hold {current}: within stabilisation window (recommendation {recommendation}, "
            f"highest in the last {window:.0f}s {highest}); {figures}"
        )
    else:
        reason = f"hold {current}: matches recommendation; {figures}"
    if notes:
        reason += " (" + "; ".join(notes) + ")"

    next_state = replace(
        state,
        recommendations=recent,
        worker_throughput=throughput,
        last_scale_at=now if target != current else state.last_scale_at,
    )
    return Decision(
        replicas=target, reason=reason, limited=limited, state=next_state, quota=outlook
    )
