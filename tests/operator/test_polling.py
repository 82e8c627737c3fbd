"""The poll loop with fakes for the database and the API, on an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leasebox.store.backlog import Backlog, KindBacklog
from leasebox.store.reputation import ProviderReputation, Verdict, judge
from leasebox_operator.errors import PoolProblem
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.models import PoolSpec
from leasebox_operator.polling import (
    ArrivalEstimator,
    DeploymentState,
    PollError,
    PoolPoller,
    backoff_delay,
    rate_window,
)
from leasebox_operator.status import StatusWriter

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SPEC: dict[str, Any] = {
    "kinds": ["otp"],
    "database": {"secretRef": {"name": "db"}},
    "provider": {"secretRef": {"name": "mail"}},
    "sla": {"oldestPendingAgeSeconds": 60},
    "scaling": {"minReplicas": 1, "maxReplicas": 20, "pollIntervalSeconds": 1,
                "scaleDownStabilizationSeconds": 10, "initialWorkerThroughput": 10,
                "startupSeconds": 2},
}  # fmt: skip


def _spec(**changes: Any) -> PoolSpec:
    return PoolSpec.model_validate(SPEC | changes)


def _backlog(ready: int, *, age: float = 0.0, pending: int | None = None,
             sent_in_window: int = 0) -> Backlog:  # fmt: skip
    pending = ready if pending is None else pending
    oldest = T0 - timedelta(seconds=age) if pending else None
    row = KindBacklog("otp", pending, ready, 0, 0, 3, oldest, oldest if ready else None,
                      sent_in_window)  # fmt: skip
    return Backlog(kinds=(row,), observed_at=T0, window_seconds=5.0)


class FakeSource:
    """The database side of a poll (implements `polling.BacklogSource`)."""

    def __init__(self) -> None:
        self.next: Backlog | PollError = _backlog(0)
        self.schema: PoolProblem | None = None
        self.verdict: Verdict | None = None

    async def check_schema(self, spec: PoolSpec) -> PoolProblem | None:
        if isinstance(self.next, PollError):
            raise self.next
        return self.schema

    async def fetch(self, spec: PoolSpec, window_seconds: float) -> Backlog:
        if isinstance(self.next, PollError):
            raise self.next
        return self.next

    async def reputation(self, spec: PoolSpec) -> Verdict | None:
        verdict, self.verdict = self.verdict, None
        return verdict


class FakeKube:
    """The worker Deployment and Events of one pool (implements `polling.PoolKube`)."""

    def __init__(self, replicas: int = 1) -> None:
        self.deployment: DeploymentState | None = DeploymentState(replicas, replicas, replicas)
        self.scaled: list[int] = []
        self.events: list[tuple[str, str, str]] = []

    async def read_deployment(self) -> DeploymentState | None:
        return self.deployment

    async def scale(self, replicas: int) -> None:
        self.scaled.append(replicas)
        self.deployment = DeploymentState(replicas, replicas, replicas)

    async def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]


class Harness:
    def __init__(self) -> None:
        self.now = 100.0
        self.source = FakeSource()
        self.kube = FakeKube()
        self.patches: list[dict[str, Any]] = []
        self.metrics = OperatorMetrics()

        async def patch(status: dict[str, Any]) -> None:
            self.patches.append(status)

        self.status = StatusWriter(patch, wallclock=lambda: T0)
        self.poller = PoolPoller(
            namespace="mail", name="otp", kube=self.kube, source=self.source,
            status=self.status, metrics=self.metrics, clock=lambda: self.now,
            wallclock=lambda: T0, max_backoff_seconds=8,
        )  # fmt: skip

    async def poll(self, spec: PoolSpec | None = None, advance: float = 1.0) -> float:
        delay = await self.poller.poll_once(spec or _spec(), 1)
        self.now += advance
        return delay

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status.conditions if c["type"] == kind)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, {"namespace": "mail", "pool": "otp",
                                                              **labels})  # fmt: skip


@pytest.fixture
def harness() -> Harness:
    return Harness()


async def test_backlog_scales_up_at_once_with_an_event_naming_the_reason(harness: Harness) -> None:
    await harness.poll()
    harness.source.next = _backlog(3000, age=40)
    delay = await harness.poll()
    assert delay == 1.0
    assert len(harness.kube.scaled) == 1
    assert harness.kube.scaled[0] > 1
    type_, reason, message = harness.kube.events[-1]
    assert (type_, reason) == ("Normal", "ScaledUp")
    assert message.startswith(f"scale up 1→{harness.kube.scaled[0]}: oldest ready 40s of 60s SLA")
    assert "backlog 3000" in message
    assert harness.status.fields["replicas"] == harness.kube.scaled[0]
    assert harness.status.fields["lastScaleReason"] == message
    assert harness.status.fields["backlog"]["ready"] == 3000


async def test_a_scaling_poll_patches_the_status_by_its_wire_names(harness: Harness) -> None:
    harness.poller.wallclock = lambda: T0.replace(microsecond=250_000)
    await harness.poll()
    harness.source.next = _backlog(3000, age=40)
    await harness.poll()
    patch = {k: v for k, v in harness.patches[-1].items() if k != "conditions"}
    assert patch == {
        "desiredReplicas": harness.kube.scaled[0],
        "replicas": harness.kube.scaled[0],
        "lastScaleTime": "2026-01-01T12:00:00Z",
        "lastScaleReason": harness.kube.events[-1][2],
        "backlog": {
            "pending": 3000, "ready": 3000, "processing": 0, "dead": 3, "expiredLeases": 0,
            "oldestPendingAgeSeconds": 40, "oldestReadyAgeSeconds": 40,
        },
        "rates": harness.patches[-1]["rates"],
    }  # fmt: skip
    assert set(patch["rates"]) == {"arrivalPerSecond", "sentPerSecond"}


async def test_idle_polls_patch_nothing_after_the_first(harness: Harness) -> None:
    await harness.poll()
    assert len(harness.patches) == 1
    first = harness.patches[0]
    assert {c["type"] for c in first["conditions"]} == {
        "Ready", "DatabaseReachable", "SLAMet", "ScalingLimited", "QuotaSufficient",
        "Paused"}  # fmt: skip
    for _ in range(3):
        await harness.poll()
    assert len(harness.patches) == 1
    assert harness.kube.scaled == []
    assert harness.kube.events == []


async def test_database_outage_keeps_replicas_and_backs_off_with_one_event(
    harness: Harness,
) -> None:
    harness.kube.deployment = DeploymentState(4, 4, 4)
    await harness.poll()
    harness.source.next = PollError("cannot connect to PostgreSQL at db:5432", "ConnectionFailed")
    delays = [await harness.poll() for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert harness.kube.deployment == DeploymentState(4, 4, 4)
    condition = harness.condition("DatabaseReachable")
    assert (condition["status"], condition["reason"]) == ("False", "ConnectionFailed")
    ready = harness.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ConnectionFailed")
    assert harness.kube.reasons().count("DatabaseUnreachable") == 1
    assert harness.sample("leasebox_operator_poll_errors_total") == 5
    harness.source.next = _backlog(0)
    assert await harness.poll() == 1.0
    assert harness.condition("DatabaseReachable")["status"] == "True"
    assert harness.kube.reasons()[-1] == "DatabaseReachable"


async def test_a_provider_over_a_page_threshold_sets_the_reputation_condition_and_an_event(
    harness: Harness,
) -> None:
    fine = ProviderReputation("ses", 9900, 100, 2, 60000, 500, 10)
    bouncing = ProviderReputation("ses", 9000, 1000, 2, 60000, 1500, 10)
    harness.source.verdict = judge([fine])
    await harness.poll()
    assert harness.condition("ReputationHealthy")["status"] == "True"
    await harness.poll()  # between reads: the condition stays
    harness.source.verdict = judge([bouncing])
    await harness.poll()
    condition = harness.condition("ReputationHealthy")
    assert (condition["status"], condition["reason"]) == ("False", "BounceRateHigh")
    assert "ses hard-bounced 10.0% today" in condition["message"]
    assert harness.kube.events[-1][:2] == ("Warning", "ReputationAtRisk")
    assert harness.condition("Ready")["status"] != "False"  # the pool itself still works
    harness.source.verdict = judge([fine])
    await harness.poll()
    assert harness.kube.events[-1][:2] == ("Normal", "ReputationHealthy")


def test_the_reputation_is_judged_only_over_enough_volume() -> None:
    assert judge([]).healthy is None
    assert judge([ProviderReputation("postmark", 50, 40, 0, 50, 40, 0)]).reason == "TooFewEvents"
    complaints = judge([ProviderReputation("sendgrid", 2000, 0, 3, 2000, 0, 3)])
    assert (complaints.healthy, complaints.reason) == (False, "ComplaintRateHigh")
    few = judge([ProviderReputation("sendgrid", 500, 0, 3, 500, 0, 3)])  # 0.6 % of too few
    assert (few.healthy, few.reason) == (True, "WithinLimits")


async def test_pause_scales_to_zero_and_holds_there_while_the_backlog_is_reported(
    harness: Harness,
) -> None:
    await harness.poll()
    paused = _spec(paused=True)
    harness.source.next = _backlog(5000, age=50)
    for _ in range(3):
        await harness.poll(paused)
    assert harness.kube.scaled == [0]
    assert harness.status.fields["desiredReplicas"] == 0
    assert harness.status.fields["replicas"] == 0
    assert harness.status.fields["backlog"]["pending"] == 5000
    assert harness.condition("Paused")["status"] == "True"
    assert harness.condition("ScalingLimited")["reason"] == "Paused"
    assert harness.kube.reasons()[-2:] == ["ScaledDown", "Paused"]
    assert harness.kube.events[-2][2] == "scale down 1→0: spec.paused is true"
    assert harness.sample("leasebox_pool_paused") == 1
    # In mode External too: spec.replicas (an HPA's) does not bring the workers back.
    external = _spec(paused=True, replicas=4, scaling={**SPEC["scaling"], "mode": "External"})
    await harness.poll(external)
    assert harness.kube.scaled == [0]
    await harness.poll()
    assert harness.kube.scaled[-1] > 1
    assert harness.kube.reasons()[-2:] == ["ScaledUp", "Resumed"]


async def test_scale_down_waits_for_the_stabilisation_window(harness: Harness) -> None:
    harness.source.next = _backlog(3000, age=30)
    await harness.poll()
    high = harness.kube.scaled[-1]
    harness.source.next = _backlog(0)
    for _ in range(9):  # 1 s polls inside the 10 s window
        await harness.poll()
    assert harness.kube.scaled == [high]
    await harness.poll()
    assert harness.kube.scaled == [high, 1]
    assert harness.kube.reasons()[-1] == "ScaledDown"


async def test_a_restarted_poller_waits_a_window_before_scaling_down(harness: Harness) -> None:
    harness.kube.deployment = DeploymentState(6, 6, 6)
    for _ in range(10):
        await harness.poll()
    assert harness.kube.scaled == []
    await harness.poll()
    assert harness.kube.scaled == [1]


async def test_missing_deployment_is_noticed_and_nothing_is_scaled(harness: Harness) -> None:
    harness.kube.deployment = None
    harness.source.next = _backlog(3000, age=30)
    await harness.poll()
    assert harness.poller.deployment_missing
    assert harness.kube.scaled == []
    assert harness.status.fields["backlog"]["ready"] == 3000


async def test_sla_breach_flips_the_condition_with_a_warning(harness: Harness) -> None:
    await harness.poll(_spec(paused=True))
    harness.source.next = _backlog(10, age=75)
    await harness.poll(_spec(paused=True))
    condition = harness.condition("SLAMet")
    assert (condition["status"], condition["reason"]) == ("False", "SLAExceeded")
    assert ("Warning", "SLAExceeded") in [(t, r) for t, r, _ in harness.kube.events]


async def test_metrics_follow_the_poll(harness: Harness) -> None:
    harness.source.next = _backlog(7, pending=9, age=12, sent_in_window=25)
    await harness.poll()
    assert harness.sample("leasebox_pool_messages", state="pending") == 9
    assert harness.sample("leasebox_pool_messages", state="ready") == 7
    assert harness.sample("leasebox_pool_messages", state="dead") == 3
    assert harness.sample("leasebox_pool_oldest_pending_timestamp_seconds") == pytest.approx(
        (T0 - timedelta(seconds=12)).timestamp()
    )
    assert harness.sample("leasebox_pool_sla_seconds") == 60
    assert harness.sample("leasebox_pool_max_replicas") == 20
    assert harness.sample("leasebox_pool_replicas") == harness.kube.deployment.replicas  # type: ignore[union-attr]
    assert harness.metrics.registry.get_sample_value(
        "leasebox_operator_poll_duration_seconds_count") == 1  # fmt: skip
    assert harness.sample("leasebox_pool_arrivals_total") == 0  # nothing measured before
    harness.source.next = _backlog(7, pending=19, age=13, sent_in_window=25)
    await harness.poll()
    assert harness.sample("leasebox_pool_arrivals_total") == pytest.approx(7.0)  # 5/s + 10/5s
    harness.metrics.forget("mail", "otp")
    assert harness.sample("leasebox_pool_messages", state="pending") is None


def test_arrival_estimate_spreads_a_burst_over_the_window_and_never_goes_negative() -> None:
    estimator = ArrivalEstimator()
    assert estimator.update(0.0, 0, 2.0, window=5.0) == 2.0
    assert estimator.update(1.0, 500, 0.0, window=5.0) == pytest.approx(100.0)
    assert estimator.update(2.0, 0, 0.0, window=5.0) == 0.0
    steady = ArrivalEstimator()
    for second in range(20):
        rate = steady.update(float(second), 10 * second, 5.0, window=5.0)
    assert rate == pytest.approx(15.0)


def test_windows_and_backoff_are_bounded() -> None:
    assert rate_window(0.5) == 5.0
    assert rate_window(5) == 15.0
    assert rate_window(60) == 60.0
    assert [backoff_delay(n, 2, 10) for n in (1, 2, 3, 4)] == [2, 4, 8, 10]


def _ready(harness: Harness) -> tuple[str, str, str]:
    ready = harness.condition("Ready")
    return ready["status"], ready["reason"], ready["message"]


async def test_ready_sums_up_database_schema_and_workers(harness: Harness) -> None:
    harness.status.problems["spec"] = None  # the reconcile handler's part is fine
    await harness.poll()
    assert _ready(harness) == ("True", "Available", "1 of 1 workers available")
    harness.kube.deployment = DeploymentState(2, 0, 0)
    await harness.poll(_spec(replicas=2, scaling={**SPEC["scaling"], "mode": "External"}))
    status, reason, message = _ready(harness)
    assert (status, reason) == ("False", "WorkersUnavailable")
    assert message.startswith("0 of 2 workers are available")
    harness.kube.deployment = DeploymentState(0, 0, 0)
    await harness.poll(_spec(scaling={**SPEC["scaling"], "minReplicas": 0}))
    assert _ready(harness)[:2] == ("True", "Available")


async def test_a_missing_schema_migrated_by_hand_is_reported_with_the_fix_and_one_event(
    harness: Harness,
) -> None:
    harness.status.problems["spec"] = None
    harness.source.schema = PoolProblem("the leasebox schema 'leasebox' does not exist; run "
                                        "`leasebox migrate`", "SchemaMissing")  # fmt: skip
    manual = _spec(database={**SPEC["database"], "migrations": "Manual"})
    for _ in range(3):
        await harness.poll(manual)
    status, reason, message = _ready(harness)
    assert (status, reason) == ("False", "SchemaMissing")
    assert "leasebox migrate" in message
    assert harness.condition("DatabaseReachable")["status"] == "True"
    assert harness.kube.reasons() == ["SchemaMissing"]
    assert harness.kube.scaled == []
    harness.source.schema = None
    await harness.poll(manual)
    assert harness.kube.reasons() == ["SchemaMissing", "SchemaReady"]
    assert _ready(harness)[0] == "True"


async def test_a_pool_at_zero_whose_workers_migrate_starts_one_worker_to_migrate(
    harness: Harness,
) -> None:
    harness.kube.deployment = DeploymentState(0, 0, 0)
    harness.source.schema = PoolProblem("the schema does not exist", "SchemaMissing")
    await harness.poll(_spec(scaling={**SPEC["scaling"], "minReplicas": 0}))
    assert harness.kube.scaled == [1]
    assert "init container migrates it" in harness.kube.events[-1][2]


async def test_in_mode_external_the_replicas_follow_spec_replicas_within_bounds(
    harness: Harness,
) -> None:
    external = {**SPEC["scaling"], "mode": "External", "maxReplicas": 5}
    harness.source.next = _backlog(3000, age=40)
    await harness.poll(_spec(scaling=external, replicas=3))
    assert harness.kube.scaled == [3]
    assert "spec.replicas is 3 (mode External)" in harness.kube.events[-1][2]
    await harness.poll(_spec(scaling=external, replicas=9))
    assert harness.kube.scaled == [3, 5]
    limited = harness.condition("ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "LimitReached")
    assert harness.status.fields["desiredReplicas"] == 5
    await harness.poll(_spec(scaling=external))  # no spec.replicas: keep what runs
    assert harness.kube.scaled == [3, 5]


def test_the_operator_registry_has_its_build_info_and_the_process_metrics() -> None:
    from prometheus_client import generate_latest

    from leasebox.version import __version__

    metrics = OperatorMetrics()
    labels = {"version": __version__, "component": "operator"}
    assert metrics.registry.get_sample_value("leasebox_build_info", labels) == 1
    assert "process_resident_memory_bytes" in generate_latest(metrics.registry).decode()
