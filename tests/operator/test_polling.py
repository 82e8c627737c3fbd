"""The poll loop with fakes for the database and the API, on an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leasebox.store.backlog import Backlog, KindBacklog
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
    def __init__(self) -> None:
        self.next: Backlog | PollError = _backlog(0)

    async def fetch(self, spec: PoolSpec, window_seconds: float) -> Backlog:
        if isinstance(self.next, PollError):
            raise self.next
        return self.next


class FakeKube:
    def __init__(self, replicas: int = 1) -> None:
        self.deployment: DeploymentState | None = DeploymentState(replicas, replicas)
        self.scaled: list[int] = []
        self.events: list[tuple[str, str, str]] = []

    async def read_deployment(self) -> DeploymentState | None:
        return self.deployment

    async def scale(self, replicas: int) -> None:
        self.scaled.append(replicas)
        self.deployment = DeploymentState(replicas, replicas)

    def event(self, type_: str, reason: str, message: str) -> None:
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


async def test_idle_polls_patch_nothing_after_the_first(harness: Harness) -> None:
    await harness.poll()
    assert len(harness.patches) == 1
    first = harness.patches[0]
    assert {c["type"] for c in first["conditions"]} == {
        "DatabaseReachable", "SLAMet", "ScalingLimited", "Paused"}  # fmt: skip
    for _ in range(3):
        await harness.poll()
    assert len(harness.patches) == 1
    assert harness.kube.scaled == []
    assert harness.kube.events == []


async def test_database_outage_keeps_replicas_and_backs_off_with_one_event(
    harness: Harness,
) -> None:
    harness.kube.deployment = DeploymentState(4, 4)
    await harness.poll()
    harness.source.next = PollError("ConnectionFailed", "cannot connect to PostgreSQL at db:5432")
    delays = [await harness.poll() for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert harness.kube.deployment == DeploymentState(4, 4)
    condition = harness.condition("DatabaseReachable")
    assert (condition["status"], condition["reason"]) == ("False", "ConnectionFailed")
    assert harness.kube.reasons().count("DatabaseUnreachable") == 1
    assert harness.sample("leasebox_operator_poll_errors_total") == 5
    harness.source.next = _backlog(0)
    assert await harness.poll() == 1.0
    assert harness.condition("DatabaseReachable")["status"] == "True"
    assert harness.kube.reasons()[-1] == "DatabaseReachable"


async def test_pause_freezes_replicas_but_reports_backlog_and_desire(harness: Harness) -> None:
    await harness.poll()
    paused = _spec(paused=True)
    harness.source.next = _backlog(5000, age=50)
    for _ in range(3):
        await harness.poll(paused)
    assert harness.kube.scaled == []
    assert harness.status.fields["desiredReplicas"] > 1
    assert harness.status.fields["replicas"] == 1
    assert harness.status.fields["backlog"]["pending"] == 5000
    assert harness.condition("Paused")["status"] == "True"
    assert "Paused" in harness.kube.reasons()
    assert harness.sample("leasebox_pool_paused") == 1
    await harness.poll()
    assert harness.kube.scaled
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
    harness.kube.deployment = DeploymentState(6, 6)
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
    assert harness.sample("leasebox_pool_sent_per_second") == 5.0
    assert harness.sample("leasebox_pool_replicas") == harness.kube.deployment.replicas  # type: ignore[union-attr]
    assert harness.metrics.registry.get_sample_value(
        "leasebox_operator_poll_duration_seconds_count") == 1  # fmt: skip
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
