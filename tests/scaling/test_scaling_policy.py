"""The scaling policy: worked cases first, then the properties that must hold for any input."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from leasebox.scaling.policy import Decision, Observation, PolicyConfig, PolicyState, decide, demand

SPEC = PolicyConfig(min_replicas=0, max_replicas=10, initial_worker_throughput=50.0)
# SLA 60 s and a budget fraction of 0.5 make the drain horizon 30 s and, at 100 msg/s,
# the backlog budget 3000 messages: 2 workers at 50 msg/s keep up.


def observe(**changes: Any) -> Observation:
    base = Observation(
        now=1000.0,
        ready=0,
        pending=0,
        oldest_ready_age_seconds=0.0,
        oldest_pending_age_seconds=0.0,
        arrival_per_second=0.0,
        sent_per_second=0.0,
        replicas=0,
        ready_replicas=0,
    )
    return replace(base, **changes)


CASES = [
    pytest.param(
        SPEC,
        observe(ready=1, pending=1, oldest_ready_age_seconds=0.2),
        PolicyState(),
        1,
        "scale up 0→1",
        id="activates from zero on a single ready message",
    ),
    pytest.param(
        SPEC,
        observe(pending=500, oldest_pending_age_seconds=90.0),
        PolicyState(),
        0,
        "hold 0",
        id="messages in backoff alone are not demand",
    ),
    pytest.param(
        SPEC,
        observe(
            ready=3000,
            pending=3000,
            oldest_ready_age_seconds=30,
            arrival_per_second=100,
            sent_per_second=100,
            replicas=2,
            ready_replicas=2,
        ),
        PolicyState(worker_throughput=50.0),
        2,
        "hold 2: matches recommendation",
        id="a backlog at its budget holds the replicas that keep up",
    ),
    pytest.param(
        SPEC,
        observe(
            ready=9000,
            pending=9000,
            oldest_ready_age_seconds=41,
            arrival_per_second=100,
            sent_per_second=100,
            replicas=2,
            ready_replicas=2,
        ),
        PolicyState(worker_throughput=50.0),
        6,
        "scale up 2→6: oldest ready 41s of 60s SLA, backlog 9000",
        id="a backlog over budget scales up at once, driven by the drain term",
    ),
    pytest.param(
        SPEC,
        observe(
            ready=30000,
            pending=30000,
            oldest_ready_age_seconds=50,
            arrival_per_second=100,
            replicas=2,
            ready_replicas=2,
        ),
        PolicyState(),
        10,
        "capped at max replicas 10",
        id="a huge backlog stops at max replicas and says so",
    ),
    pytest.param(
        replace(SPEC, max_scale_up_step=2),
        observe(
            ready=9000,
            pending=9000,
            oldest_ready_age_seconds=41,
            arrival_per_second=100,
            replicas=1,
            ready_replicas=1,
        ),
        PolicyState(),
        3,
        "step limited to +2",
        id="an up step limit adds at most that many pods",
    ),
    pytest.param(
        SPEC,
        observe(
            ready=9000,
            pending=9000,
            oldest_ready_age_seconds=41,
            arrival_per_second=100,
            replicas=6,
            ready_replicas=1,
        ),
        PolicyState(),
        6,
        "hold 6",
        id="pods still starting count as capacity and are not ordered again",
    ),
    pytest.param(
        SPEC,
        observe(ready=0, arrival_per_second=100, replicas=8, ready_replicas=8),
        PolicyState(recommendations=((940.0, 8),)),
        8,
        "hold 8: within stabilisation window",
        id="no scale-down inside the stabilisation window",
    ),
    pytest.param(
        SPEC,
        observe(ready=0, arrival_per_second=100, replicas=8, ready_replicas=8),
        PolicyState(recommendations=((800.0, 8), (950.0, 5))),
        5,
        "scale down 8→5: highest recommendation in the last 120s is 5",
        id="a scale-down goes only to the highest recommendation in the window",
    ),
    pytest.param(
        replace(SPEC, max_scale_down_step=1),
        observe(replicas=8, ready_replicas=8),
        PolicyState(recommendations=((800.0, 8),)),
        7,
        "step limited to -1",
        id="a down step limit removes at most that many pods",
    ),
    pytest.param(
        replace(SPEC, min_replicas=2),
        observe(replicas=2, ready_replicas=2),
        PolicyState(),
        2,
        "raised to min replicas 2",
        id="an idle pool stays at min replicas",
    ),
    pytest.param(
        SPEC,
        observe(
            ready=9000,
            pending=9000,
            oldest_ready_age_seconds=41,
            arrival_per_second=100,
            replicas=6,
            ready_replicas=6,
        ),
        PolicyState(worker_throughput=25.0),
        10,
        "25.0 msg/s per worker",
        id="a measured slowdown asks for more workers than the initial guess",
    ),
]


@pytest.mark.parametrize(("spec", "observation", "state", "replicas", "reason"), CASES)
def test_decides_the_worked_cases(
    spec: PolicyConfig, observation: Observation, state: PolicyState, replicas: int, reason: str
) -> None:
    decision = decide(observation, spec, state)
    assert decision.replicas == replicas, decision.reason
    assert reason in decision.reason


def test_flags_a_recommendation_clipped_by_max_replicas_as_limited() -> None:
    big = observe(ready=30000, oldest_ready_age_seconds=50, arrival_per_second=100, replicas=2)
    assert decide(big, SPEC, PolicyState()).limited
    assert not decide(observe(ready=3000, arrival_per_second=100), SPEC, PolicyState()).limited


def test_names_the_term_that_drove_the_decision() -> None:
    assert demand(observe(ready=9000, arrival_per_second=100), SPEC, 50.0).term == "drain"
    assert demand(observe(ready=3000, arrival_per_second=100), SPEC, 50.0).term == "rate"
    hurried = replace(SPEC, drain_horizon_seconds=26.0)
    assert demand(observe(ready=3, arrival_per_second=100), hurried, 50.0).term == "activation"
    assert demand(observe(), SPEC, 50.0).term == "idle"


def busy(**changes: Any) -> Observation:
    values: dict[str, Any] = {
        "ready": 500,
        "pending": 500,
        "oldest_ready_age_seconds": 12.0,
        "arrival_per_second": 100.0,
        "sent_per_second": 160.0,
        "replicas": 4,
        "ready_replicas": 4,
    }
    values.update(changes)
    return observe(**values)


def test_measures_worker_throughput_while_workers_are_busy() -> None:
    first = decide(busy(), SPEC, PolicyState())
    assert first.state.worker_throughput == pytest.approx(40.0)
    second = decide(busy(sent_per_second=80.0), SPEC, first.state)
    assert second.state.worker_throughput == pytest.approx(0.3 * 20.0 + 0.7 * 40.0)


def test_takes_a_near_zero_measured_throughput_at_its_floor() -> None:
    state = PolicyState()
    for _ in range(20):
        stalled = busy(sent_per_second=0.004, oldest_ready_age_seconds=40.0)
        decision = decide(stalled, SPEC, state)
        state = decision.state
    assert state.worker_throughput == pytest.approx(0.001)
    assert "5.0 msg/s per worker" in decision.reason


@pytest.mark.parametrize(
    "idle",
    [
        pytest.param({"ready": 0, "oldest_ready_age_seconds": 0.0}, id="empty queue"),
        pytest.param({"oldest_ready_age_seconds": 1.0}, id="backlog younger than the window"),
        pytest.param({"ready_replicas": 0}, id="no ready pod"),
    ],
)
def test_does_not_measure_throughput_while_workers_may_be_idle(idle: dict[str, Any]) -> None:
    state = PolicyState(worker_throughput=40.0)
    for _ in range(20):
        state = decide(busy(sent_per_second=8.0, **idle), SPEC, state).state
    assert state.worker_throughput == 40.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, "must not exceed"),
        ({"max_replicas": 0}, "max_replicas must be >= 1"),
        ({"sla_seconds": 0.0}, "sla_seconds must be > 0"),
        ({"poll_interval_seconds": float("nan")}, "finite"),
        ({"max_scale_up_step": 0}, "max_scale_up_step"),
        ({"backlog_budget_fraction": 1.0}, "backlog_budget_fraction"),
        ({"drain_horizon_seconds": 25.0}, "must exceed start-up plus one poll"),
        ({"throughput_smoothing": 0.0}, "throughput_smoothing"),
        ({"min_throughput_fraction": 0.0}, "min_throughput_fraction"),
    ],
)
def test_rejects_an_invalid_spec_with_a_clear_message(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        PolicyConfig(**changes)


def test_rejects_a_negative_observation() -> None:
    with pytest.raises(ValueError, match="ready must be >= 0"):
        observe(ready=-1)


def test_resolves_the_default_drain_horizon_beyond_start_up_plus_a_poll() -> None:
    assert PolicyConfig().drain_horizon == 30.0
    short_sla = PolicyConfig(sla_seconds=20.0)
    assert short_sla.drain_horizon > short_sla.startup_seconds + short_sla.poll_interval_seconds


# Properties ---------------------------------------------------------------------------------


@st.composite
def specs(draw: st.DrawFn) -> PolicyConfig:
    low = draw(st.integers(0, 5))
    return PolicyConfig(
        min_replicas=low,
        max_replicas=draw(st.integers(max(low, 1), 60)),
        sla_seconds=draw(st.floats(10, 600)),
        poll_interval_seconds=draw(st.floats(1, 30)),
        scale_down_stabilization_seconds=draw(st.floats(0, 600)),
        max_scale_up_step=draw(st.none() | st.integers(1, 10)),
        max_scale_down_step=draw(st.none() | st.integers(1, 10)),
        initial_worker_throughput=draw(st.floats(0.5, 500)),
        startup_seconds=draw(st.floats(0, 120)),
        backlog_budget_fraction=draw(st.floats(0.05, 0.95)),
    )


@st.composite
def observations(draw: st.DrawFn) -> Observation:
    ready = draw(st.integers(0, 200_000))
    replicas = draw(st.integers(0, 80))
    return Observation(
        now=draw(st.floats(0, 1e6)),
        ready=ready,
        pending=ready + draw(st.integers(0, 10_000)),
        oldest_ready_age_seconds=draw(st.floats(0, 3600)) if ready else 0.0,
        oldest_pending_age_seconds=draw(st.floats(0, 3600)),
        arrival_per_second=draw(st.floats(0, 5000)),
        sent_per_second=draw(st.floats(0, 5000)),
        replicas=replicas,
        ready_replicas=draw(st.integers(0, replicas)),
    )


@st.composite
def states(draw: st.DrawFn, now: float = 1e6) -> PolicyState:
    times = draw(st.lists(st.floats(0, 1e6), max_size=6))
    return PolicyState(
        recommendations=tuple(sorted((t, draw(st.integers(0, 80))) for t in times)),
        worker_throughput=draw(st.none() | st.floats(0.5, 500)),
    )


@given(specs(), observations(), states())
def test_decides_within_min_and_max_replicas(
    spec: PolicyConfig, observation: Observation, state: PolicyState
) -> None:
    decision = decide(observation, spec, state)
    assert spec.min_replicas <= decision.replicas <= spec.max_replicas


@given(specs(), observations(), states())
def test_reasons_name_the_direction_and_old_to_new(
    spec: PolicyConfig, observation: Observation, state: PolicyState
) -> None:
    decision: Decision = decide(observation, spec, state)
    old, new = observation.replicas, decision.replicas
    if new > old:
        assert decision.reason.startswith(f"scale up {old}→{new}: ")
    elif new < old:
        assert decision.reason.startswith(f"scale down {old}→{new}: ")
    else:
        assert decision.reason.startswith(f"hold {old}: ")
    assert "term" in decision.reason


@given(
    specs(),
    observations(),
    states(),
    st.integers(0, 100_000),
    st.floats(0, 600),
)
def test_never_decides_fewer_when_ready_backlog_or_age_grows(
    spec: PolicyConfig, base: Observation, state: PolicyState, more: int, older: float
) -> None:
    # Both observations are busy, so both take the same throughput sample.
    base = replace(
        base,
        ready=max(base.ready, 1),
        oldest_ready_age_seconds=max(base.oldest_ready_age_seconds, spec.rate_window),
    )
    grown = replace(
        base,
        ready=base.ready + more,
        pending=base.pending + more,
        oldest_ready_age_seconds=base.oldest_ready_age_seconds + older,
    )
    assert decide(grown, spec, state).replicas >= decide(base, spec, state).replicas


@given(specs(), observations(), st.floats(0, 1), st.integers(0, 10_000))
def test_does_not_scale_down_inside_the_stabilisation_window(
    spec: PolicyConfig, observation: Observation, fraction: float, drop: int
) -> None:
    assume(spec.scale_down_stabilization_seconds >= 1)
    first = decide(observation, spec, PolicyState())
    later = replace(
        observation,
        now=observation.now + fraction * spec.scale_down_stabilization_seconds * 0.999,
        ready=max(0, observation.ready - drop),
        replicas=first.replicas,
        ready_replicas=first.replicas,
    )
    recommended = first.state.recommendations[-1][1]
    second = decide(later, spec, first.state)
    assert second.replicas >= min(recommended, first.replicas)


@given(specs(), observations())
def test_scales_from_zero_on_any_ready_backlog(
    spec: PolicyConfig, observation: Observation
) -> None:
    observation = replace(
        observation, ready=max(observation.ready, 1), replicas=0, ready_replicas=0
    )
    assert decide(observation, spec, PolicyState()).replicas >= 1


@given(specs(), observations(), states(), st.integers(1, 1_000_000))
def test_messages_in_backoff_alone_do_not_scale_up(
    spec: PolicyConfig, observation: Observation, state: PolicyState, waiting: int
) -> None:
    idle = replace(
        observation, ready=0, pending=0, oldest_ready_age_seconds=0.0, arrival_per_second=0.0
    )
    backing_off = replace(idle, pending=waiting, oldest_pending_age_seconds=3000.0)
    decided = decide(backing_off, spec, state)
    assert decided.replicas == decide(idle, spec, state).replicas
    assert decided.replicas <= max(idle.replicas, spec.min_replicas)


@settings(max_examples=50)
@given(st.lists(observations(), min_size=2, max_size=12), specs())
def test_keeps_only_recommendations_inside_the_window(
    sequence: list[Observation], spec: PolicyConfig
) -> None:
    state, now = PolicyState(), 0.0
    for observation in sequence:
        now += spec.poll_interval_seconds
        state = decide(replace(observation, now=now), spec, state).state
        window = spec.scale_down_stabilization_seconds
        *older, (latest, _) = state.recommendations
        assert latest == now
        assert all(now - window < at <= now for at, _ in older)


QUOTA = replace(SPEC, quota_per_second=100.0)


def test_a_pool_under_a_quota_gets_no_more_workers_than_the_quota_keeps_busy() -> None:
    # 20,000 ready at 300 msg/s would ask for 10 workers; 100 msg/s keeps 2 of 50 msg/s busy.
    flood = observe(ready=20000, pending=20000, oldest_ready_age_seconds=5, arrival_per_second=300)
    free = decide(flood, SPEC, PolicyState())
    capped = decide(flood, QUOTA, PolicyState())
    assert free.replicas == 10
    assert capped.replicas == 2
    assert "capped at the 2 workers the quota of 100/s keeps busy" in capped.reason
    assert capped.limited


def test_arrivals_above_the_quota_say_when_the_backlog_passes_the_sla() -> None:
    # 150/s into a quota of 100/s with 1,000 ready: 6,000 ready (100/s * 60 s) are reached in
    # 100 s, and the oldest message is past the SLA 60 s after that.
    over = observe(ready=1000, pending=1000, oldest_ready_age_seconds=10, arrival_per_second=150)
    outlook = decide(over, QUOTA, PolicyState()).quota
    assert outlook is not None
    assert outlook.seconds_to_breach == pytest.approx(160.0)
    assert not outlook.sufficient
    assert outlook.message.startswith("backlog will exceed the SLA in 160 s at the quota of 100/s")
    late = replace(over, oldest_pending_age_seconds=61.0)
    assert decide(late, QUOTA, PolicyState()).quota.seconds_to_breach == 0.0  # type: ignore[union-attr]


def test_arrivals_within_the_quota_are_sufficient_and_scaled_as_without_one() -> None:
    calm = observe(ready=100, pending=100, oldest_ready_age_seconds=2, arrival_per_second=60)
    with_quota = decide(calm, QUOTA, PolicyState())
    assert with_quota.quota is not None
    assert with_quota.quota.sufficient
    assert with_quota.replicas == decide(calm, SPEC, PolicyState()).replicas
    assert decide(calm, SPEC, PolicyState()).quota is None


def test_a_send_rate_held_at_the_quota_is_not_taken_for_the_workers_throughput() -> None:
    # Two busy workers sending 95/s under a quota of 100/s are waiting for tokens, not slow.
    busy = observe(
        ready=5000,
        pending=5000,
        oldest_ready_age_seconds=30,
        arrival_per_second=95,
        sent_per_second=95,
        replicas=4,
        ready_replicas=4,
    )
    assert decide(busy, SPEC, PolicyState()).state.worker_throughput == pytest.approx(23.75)
    assert decide(busy, QUOTA, PolicyState()).state.worker_throughput is None


def test_a_quota_must_be_a_positive_finite_rate() -> None:
    with pytest.raises(ValueError, match="quota_per_second must be > 0"):
        replace(SPEC, quota_per_second=0.0)
    with pytest.raises(ValueError, match="quota_per_second must be a finite number"):
        replace(SPEC, quota_per_second=float("inf"))
