"""The discrete-time pool model `leasebox simulate` runs every policy through.

One pool, one-second ticks: messages join a FIFO queue in per-second cohorts
(so the oldest message's age is exact, not inferred), ready workers send them,
and pods asked for become ready only after a start-up delay. A controller, the
leasebox policy or an HPA, looks at the pool on its own schedule and sets the
replica count. The model is deliberately small, because the whole comparison
(every scenario, every setting) must run in seconds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Protocol

from leasebox.scaling.policy import Observation, PolicyConfig, PolicyState, decide
from leasebox.scaling.simulation.hpa import HpaSpec, HpaState, hpa_step
from leasebox.scaling.simulation.scenarios import Workload

__all__ = [
    "Controller",
    "HpaController",
    "LeaseboxController",
    "PoolView",
    "RunResult",
    "SimulationConfig",
    "controllers",
    "run_simulation",
]


@dataclass(frozen=True)
class SimulationConfig:
    """The pool every policy is simulated on; the same for every scenario.

    Attributes:
        duration_seconds: length of a built-in scenario.
        seed: seeds arrivals and throughput noise.
        sla_seconds: the oldest ready age promised.
        startup_seconds: delay between asking for a pod and its first send.
        worker_throughput: nominal messages per second of one worker.
        throughput_spread: relative standard deviation of one worker's
            throughput in one second.
        min_replicas: fewest workers, for every policy alike.
        max_replicas: most workers, for every policy alike.
        poll_interval_seconds: how often the leasebox policy decides; its send
            and arrival rates are measured over this window.
        backlog_targets: the `AverageValue` targets of the backlog HPA sweep.
        age_fractions: the `Value` targets of the age HPA sweep, as SLA fractions.
    """

    duration_seconds: int = 3600
    seed: int = 1
    sla_seconds: float = 60.0
    startup_seconds: int = 20
    worker_throughput: float = 20.0
    throughput_spread: float = 0.2
    min_replicas: int = 1
    max_replicas: int = 50
    poll_interval_seconds: int = 5
    backlog_targets: tuple[float, ...] = (50.0, 100.0, 200.0, 400.0, 800.0)
    age_fractions: tuple[float, ...] = (1 / 6, 1 / 3, 1 / 2, 3 / 4)

    def __post_init__(self) -> None:
        if self.duration_seconds <= 0 or self.sla_seconds <= 0 or self.startup_seconds < 0:
            raise ValueError("duration and SLA must be > 0 and start-up >= 0")
        if self.worker_throughput <= 0 or self.poll_interval_seconds <= 0:
            raise ValueError("worker throughput and poll interval must be > 0")

    def policy_config(self) -> PolicyConfig:
        """The one leasebox configuration used on every scenario: defaults plus the pool."""
        return PolicyConfig(
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            sla_seconds=self.sla_seconds,
            poll_interval_seconds=float(self.poll_interval_seconds),
            startup_seconds=float(self.startup_seconds),
        )


@dataclass(frozen=True)
class PoolView:
    """What a controller sees of the pool at one instant."""

    now: float
    ready: int
    oldest_age_seconds: float
    arrival_per_second: float
    sent_per_second: float
    replicas: int
    ready_replicas: int


class Controller(Protocol):
    """A scaling policy under test; `warning` is the first quota warning it gave and when."""

    policy: str
    setting: str
    warning: tuple[float, str] | None

    @property
    def interval(self) -> int:
        """Seconds between decisions."""
        ...

    def step(self, view: PoolView) -> int:
        """The replicas to request after seeing `view`."""
        ...


@dataclass
class LeaseboxController:
    """Runs `leasebox.scaling.policy.decide`, the code the operator runs."""

    spec: PolicyConfig
    policy: str = "leasebox"
    setting: str = "default"
    state: PolicyState = field(default_factory=PolicyState)
    warning: tuple[float, str] | None = None

    @property
    def interval(self) -> int:
        """Seconds between decisions."""
        return max(1, round(self.spec.poll_interval_seconds))

    def step(self, view: PoolView) -> int:
        """Observe, decide, remember."""
        observation = Observation(
            now=view.now,
            ready=view.ready,
            pending=view.ready,
            oldest_ready_age_seconds=view.oldest_age_seconds,
            oldest_pending_age_seconds=view.oldest_age_seconds,
            arrival_per_second=view.arrival_per_second,
            sent_per_second=view.sent_per_second,
            replicas=view.replicas,
            ready_replicas=view.ready_replicas,
        )
        decision = decide(observation, self.spec, self.state)
        self.state = decision.state
        outlook = decision.quota
        if self.warning is None and outlook is not None and not outlook.sufficient:
            self.warning = (view.now, outlook.message)
        return decision.replicas


@dataclass
class HpaController:
    """Runs the HPA model on one KEDA trigger."""

    spec: HpaSpec
    policy: str
    setting: str
    state: HpaState = field(default_factory=HpaState)
    warning: tuple[float, str] | None = None

    @property
    def interval(self) -> int:
        """Seconds between syncs."""
        return max(1, round(self.spec.sync_period_seconds))

    def step(self, view: PoolView) -> int:
        """One sync on the trigger's metric."""
        value = float(view.ready) if self.spec.metric == "backlog" else view.oldest_age_seconds
        replicas, self.state = hpa_step(
            self.spec, self.state, view.now, value, view.replicas, view.ready_replicas
        )
        return replicas


@dataclass(frozen=True)
class RunResult:
    """One policy setting on one workload.

    Attributes:
        policy: "leasebox", "hpa-backlog" or "hpa-age".
        setting: the policy's configuration, for humans.
        seconds_over_sla: seconds during which the oldest ready message was older than the SLA.
        max_oldest_age_seconds: the worst oldest ready age.
        worker_seconds: pod-seconds paid for, starting pods included.
        scale_events: changes of the replica count.
        on_pareto_front: no other setting of the comparison is at least as good
            on both seconds over the SLA and worker-seconds and better on one.
        oldest_age: the oldest ready age at the end of each second.
        replicas: the requested replicas at the end of each second.
        warning: when the policy first said the quota would breach the SLA, and how.
        sla: the SLA the run was judged on.
    """

    policy: str
    setting: str
    seconds_over_sla: int
    max_oldest_age_seconds: float
    worker_seconds: float
    scale_events: int
    on_pareto_front: bool = False
    oldest_age: tuple[float, ...] = field(default=(), repr=False)
    replicas: tuple[int, ...] = field(default=(), repr=False)
    warning: tuple[float, str] | None = None
    sla: float = field(default=0.0, repr=False)

    @property
    def first_over_sla(self) -> int | None:
        """The first second at whose end the oldest message was past the SLA."""
        return next((t for t, age in enumerate(self.oldest_age) if age > self.sla), None)


def _initial_replicas(workload: Workload, config: SimulationConfig) -> int:
    head = workload.arrivals[:60]
    needed = math.ceil(sum(head) / len(head) / workload.throughput[0]) if head else 0
    return max(config.min_replicas, min(config.max_replicas, needed))


def run_simulation(
    workload: Workload, controller: Controller, config: SimulationConfig
) -> RunResult:
    """Replay `workload` under `controller`; deterministic for a given workload."""
    queue: deque[list[float]] = deque()
    queued = 0
    carry = 0.0
    ready_pods = _initial_replicas(workload, config)
    starting: deque[int] = deque()
    arrived_total = [0]
    sent_total = [0]
    window = config.poll_interval_seconds
    over = events = 0
    worst = worker_seconds = 0.0
    ages: list[float] = []
    replica_log: list[int] = []
    spread = config.throughput_spread
    quota = workload.quota_per_second
    tokens = quota or 0.0
    for t in range(workload.duration):
        while starting and starting[0] <= t:
            starting.popleft()
            ready_pods += 1
        arriving = workload.arrivals[t]
        if arriving:
            queue.append([t + 0.5, arriving])
            queued += arriving
        capacity = 0.0
        if ready_pods:
            jitter = 1 + spread * workload.noise[t] / math.sqrt(ready_pods)
            capacity = max(0.0, ready_pods * workload.throughput[t] * jitter)
        budget = capacity + carry
        can_send = min(queued, int(budget))
        if quota is not None:
            # The account's tokens: `quota` a second, at most a second's worth kept.
            can_send = min(can_send, int(tokens))
            tokens = min(quota, tokens - can_send) + quota
        remaining = can_send
        while remaining:
            head = queue[0]
            if head[1] <= remaining:
                remaining -= int(head[1])
                queue.popleft()
            else:
                head[1] -= remaining
                remaining = 0
        queued -= can_send
        carry = budget - can_send if queued else 0.0
        arrived_total.append(arrived_total[-1] + arriving)
        sent_total.append(sent_total[-1] + can_send)

        now = t + 1.0
        age = now - queue[0][0] if queue else 0.0
        over += age > config.sla_seconds
        worst = max(worst, age)
        replicas = ready_pods + len(starting)
        worker_seconds += replicas

        if (t + 1) % controller.interval == 0:
            span = min(window, t + 1)
            view = PoolView(
                now=now,
                ready=queued,
                oldest_age_seconds=age,
                arrival_per_second=(arrived_total[-1] - arrived_total[-1 - span]) / span,
                sent_per_second=(sent_total[-1] - sent_total[-1 - span]) / span,
                replicas=replicas,
                ready_replicas=ready_pods,
            )
            wanted = controller.step(view)
            if wanted != replicas:
                events += 1
            while wanted > ready_pods + len(starting):
                starting.append(t + 1 + config.startup_seconds)
            while wanted < ready_pods + len(starting):
                if starting:
                    starting.pop()
                else:
                    ready_pods -= 1
            replicas = wanted
        ages.append(age)
        replica_log.append(replicas)
    return RunResult(
        policy=controller.policy,
        setting=controller.setting,
        seconds_over_sla=over,
        max_oldest_age_seconds=worst,
        worker_seconds=worker_seconds,
        scale_events=events,
        oldest_age=tuple(ages),
        replicas=tuple(replica_log),
        warning=controller.warning,
        sla=config.sla_seconds,
    )


def controllers(config: SimulationConfig, quota: float | None = None) -> list[Controller]:
    """The leasebox policy (told the provider `quota`, as the operator is) and both swept
    HPA baselines, fresh for one run each."""
    made: list[Controller] = [
        LeaseboxController(replace(config.policy_config(), quota_per_second=quota))
    ]
    limits = {"min_replicas": config.min_replicas, "max_replicas": config.max_replicas}
    for target in config.backlog_targets:
        spec = HpaSpec("backlog", target, "AverageValue", **limits)
        made.append(HpaController(spec, "hpa-backlog", f"AverageValue {target:g}"))
    for fraction in config.age_fractions:
        seconds = fraction * config.sla_seconds
        spec = HpaSpec("age", seconds, "Value", **limits)
        label = f"Value {seconds:g}s ({fraction:.2f} SLA)"
        made.append(HpaController(spec, "hpa-age", label))
    return made
