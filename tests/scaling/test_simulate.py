"""`leasebox simulate`: a deterministic model, faithful baselines, and the policy's claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leasebox.scaling.simulation import report
from leasebox.scaling.simulation.engine import Controller, run_simulation
from leasebox.scaling.simulation.hpa import HpaSpec, HpaState, hpa_metric_replicas, hpa_step
from leasebox.scaling.simulation.runner import (
    RunResult,
    ScenarioComparison,
    SimulationConfig,
    compare,
    format_table,
    main,
    policy_verdicts,
    scenario_workload,
    to_json,
)
from leasebox.scaling.simulation.scenarios import (
    BURST_SCENARIOS,
    SCENARIOS,
    TraceError,
    Workload,
    load_trace,
)

SHORT = SimulationConfig(duration_seconds=900)


@pytest.fixture(scope="module")
def built_in() -> list[ScenarioComparison]:
    """Every built-in scenario at full length, default configuration (about a second)."""
    config = SimulationConfig()
    return [
        compare(scenario_workload(name, config), config, burst=name in BURST_SCENARIOS)
        for name in SCENARIOS
    ]


def test_replays_identically_under_the_same_seed() -> None:
    first = compare(scenario_workload("login-burst", SHORT), SHORT, burst=True)
    again = compare(scenario_workload("login-burst", SHORT), SHORT, burst=True)
    assert first == again
    other_seed = SimulationConfig(duration_seconds=900, seed=2)
    assert scenario_workload("steady", other_seed) != scenario_workload("steady", SHORT)


def test_gives_every_policy_the_same_arrivals(
    built_in: list[ScenarioComparison], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = SimulationConfig()
    workload = scenario_workload("flash-crowd", config)
    assert max(workload.arrivals) > 40 * 30
    for comparison in built_in:
        assert len(comparison.results) == 1 + 5 + 4
    # Every run of a comparison is handed the one workload: the same arrivals second by
    # second, the same throughput and the same noise draws.
    runs: list[tuple[Workload, str, str]] = []

    def recording(given: Workload, controller: Controller, cfg: SimulationConfig) -> RunResult:
        runs.append((given, controller.policy, controller.setting))
        return run_simulation(given, controller, cfg)

    monkeypatch.setattr(report, "run_simulation", recording)
    comparison = compare(workload, config, burst=True)
    assert [(policy, setting) for _, policy, setting in runs] == [
        (r.policy, r.setting) for r in comparison.results
    ]
    assert len({setting for _, _, setting in runs}) == len(runs) == 1 + 5 + 4
    fresh = scenario_workload("flash-crowd", config)
    for given, _, _ in runs:
        assert given.arrivals == fresh.arrivals
        assert (given.throughput, given.noise) == (fresh.throughput, fresh.noise)


# Traces -------------------------------------------------------------------------------------


def test_loads_a_csv_trace_and_runs_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("t_seconds,arrivals_per_second\n0,20\n120,200\n240,20\n")
    points = load_trace(trace)
    assert [(p.t_seconds, p.arrivals_per_second) for p in points] == [
        (0, 20),
        (120, 200),
        (240, 20),
    ]
    assert main(["--trace", str(trace), "--duration", "600"]) == 0
    out = capsys.readouterr().out
    assert "== trace.csv" in out
    assert "n/a  trace.csv" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("time,rate\n0,1\n", ":1: expected the header"),
        ("t_seconds,arrivals_per_second\n0,1\n10,lots\n", ":3: not a number"),
        ("t_seconds,arrivals_per_second\n0,1\n10\n", ":3: expected 2 columns"),
        ("t_seconds,arrivals_per_second\n10,1\n5,1\n", ":3: t_seconds must increase"),
        ("t_seconds,arrivals_per_second\n0,-4\n", ":2: values must be finite and >= 0"),
        ("t_seconds,arrivals_per_second\n", "the trace has no rows"),
        ("", ":1: expected the header"),
    ],
)
def test_rejects_a_malformed_trace_naming_the_line(
    tmp_path: Path, content: str, message: str
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(content)
    with pytest.raises(TraceError, match=message):
        load_trace(trace)


def test_reports_a_malformed_trace_on_stderr_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("t_seconds,arrivals_per_second\n0,x\n")
    assert main(["--trace", str(trace)]) == 2
    assert "bad.csv:2: not a number" in capsys.readouterr().err


# The HPA baseline ---------------------------------------------------------------------------

BACKLOG = HpaSpec("backlog", 100.0, "AverageValue", min_replicas=1, max_replicas=50)
AGE = HpaSpec("age", 30.0, "Value", min_replicas=1, max_replicas=50)


def test_hpa_keeps_replicas_within_its_tolerance() -> None:
    assert hpa_metric_replicas(BACKLOG, 1050.0, 10, 10) == 10
    assert hpa_metric_replicas(BACKLOG, 1150.0, 10, 10) == 12
    assert hpa_metric_replicas(AGE, 32.0, 10, 10) == 10


def test_hpa_divides_average_value_by_all_pods_and_multiplies_value_by_ready_pods() -> None:
    assert hpa_metric_replicas(BACKLOG, 2000.0, 10, 2) == 20
    assert hpa_metric_replicas(AGE, 60.0, 10, 4) == 8


def test_hpa_scale_up_is_limited_to_double_or_four_pods_per_period() -> None:
    replicas, state = hpa_step(BACKLOG, HpaState(), 0.0, 100_000.0, 3, 3)
    assert replicas == 7
    replicas, state = hpa_step(BACKLOG, state, 10.0, 100_000.0, replicas, 3)
    assert replicas == 7, "the period started at 3, so 3 + 4 is still the limit"
    replicas, state = hpa_step(BACKLOG, state, 15.0, 100_000.0, replicas, 7)
    assert replicas == 14
    replicas, state = hpa_step(BACKLOG, state, 30.0, 100_000.0, replicas, 14)
    assert replicas == 28
    replicas, _ = hpa_step(BACKLOG, state, 45.0, 100_000.0, replicas, 28)
    assert replicas == 50


def test_hpa_scales_down_only_to_the_highest_recommendation_of_the_last_300_seconds() -> None:
    replicas, state = hpa_step(BACKLOG, HpaState(), 0.0, 1000.0, 10, 10)
    assert replicas == 10
    replicas, state = hpa_step(BACKLOG, state, 150.0, 600.0, replicas, 10)
    assert replicas == 10
    replicas, state = hpa_step(BACKLOG, state, 290.0, 100.0, replicas, 10)
    assert replicas == 10
    replicas, state = hpa_step(BACKLOG, state, 300.0, 100.0, replicas, 10)
    assert replicas == 6, "the recommendation of 10 left the window; 6 at t=150 is the highest"
    replicas, _ = hpa_step(BACKLOG, state, 450.0, 100.0, replicas, 6)
    assert replicas == 1


def test_simulated_hpas_never_outrun_their_rate_limit(built_in: list[ScenarioComparison]) -> None:
    flash = next(c for c in built_in if c.scenario == "flash-crowd")
    for result in flash.baselines:
        steps = result.replicas
        for t in range(15, len(steps)):
            start = steps[t - 15]
            assert steps[t] <= max(2 * start, start + 4), (result.setting, t)


def test_sweeps_the_baselines_over_their_full_range() -> None:
    config = SimulationConfig()
    assert config.backlog_targets == (50.0, 100.0, 200.0, 400.0, 800.0)
    assert config.age_fractions == pytest.approx((1 / 6, 1 / 3, 1 / 2, 3 / 4))


# The policy's claims ------------------------------------------------------------------------


def test_policy_meets_its_claims_on_every_built_in_scenario(
    built_in: list[ScenarioComparison],
) -> None:
    failed = [claim for claim in policy_verdicts(built_in) if not claim.holds]
    assert not failed, "\n".join(f"{c.scenario} {c.name}: {c.detail}" for c in failed)
    for comparison in built_in:
        if comparison.quota_per_second is None:  # above a quota no policy meets the SLA
            assert comparison.leasebox.seconds_over_sla == 0
        assert comparison.leasebox.on_pareto_front


def result(setting: str, over: int, cost: float) -> RunResult:
    policy = "leasebox" if setting == "policy" else "hpa-backlog"
    return RunResult(policy, setting, over, 10.0, cost, 3)


def test_a_verdict_names_the_baseline_that_beats_the_policy() -> None:
    comparison = ScenarioComparison(
        "made-up",
        "",
        True,
        (result("policy", 0, 1000.0), result("cheap", 0, 900.0), result("late", 40, 500.0)),
    )
    verdicts = {claim.name: claim for claim in policy_verdicts([comparison])}
    assert not verdicts["not-dominated"].holds
    assert "hpa-backlog cheap: 0s over SLA, 900 worker-s" in verdicts["not-dominated"].detail
    assert not verdicts["cheapest-on-bursts"].holds
    assert verdicts["meets-sla"].holds


def test_a_baseline_within_five_percent_does_not_count_as_better() -> None:
    comparison = ScenarioComparison(
        "made-up", "", False, (result("policy", 0, 1000.0), result("close", 0, 960.0))
    )
    verdicts = {claim.name: claim for claim in policy_verdicts([comparison])}
    assert verdicts["not-dominated"].holds
    assert not verdicts["cheapest-on-bursts"].applicable


def test_exits_non_zero_under_strict_only_when_a_claim_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    impossible = [
        "--scenario",
        "login-burst",
        "--duration",
        "900",
        "--sla",
        "15",
        "--startup",
        "40",
    ]
    assert main(impossible) == 0
    assert "FAIL login-burst        meets-sla" in capsys.readouterr().out
    assert main([*impossible, "--strict"]) == 1
    assert main(["--scenario", "steady", "--duration", "900", "--strict"]) == 0


# Output -------------------------------------------------------------------------------------


def test_json_output_has_every_setting_with_its_figures(built_in: list[ScenarioComparison]) -> None:
    document = json.loads(to_json(built_in, SimulationConfig()))
    assert document["config"]["sla_seconds"] == 60.0
    assert [s["name"] for s in document["scenarios"]] == list(SCENARIOS)
    assert document["all_claims_hold"] is True
    for scenario in document["scenarios"]:
        assert len(scenario["results"]) == 10
        quota = {"within-quota", "warns-before-breach"} if scenario["quota_per_second"] else set()
        assert {c["name"] for c in scenario["claims"]} == {
            "meets-sla",
            "cheapest-on-bursts",
            "not-dominated",
            *quota,
        }
        for row in scenario["results"]:
            assert set(row) == {
                "policy",
                "setting",
                "seconds_over_sla",
                "max_oldest_age_seconds",
                "worker_seconds",
                "scale_events",
                "on_pareto_front",
            }
    assert isinstance(document["baselines_meeting_sla_everywhere"], list)


def test_json_flag_prints_only_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "steady", "--duration", "600", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scenarios"][0]["name"] == "steady"


def test_table_marks_the_pareto_front(built_in: list[ScenarioComparison]) -> None:
    table = format_table(built_in)
    policy_row = next(line for line in table.splitlines() if line.startswith("leasebox"))
    assert policy_row.rstrip().endswith("*")


def test_plot_writes_a_png(tmp_path: Path) -> None:
    chart = tmp_path / "chart.png"
    assert main(["--scenario", "flash-crowd", "--duration", "600", "--plot", str(chart)]) == 0
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_under_a_quota_the_policy_adds_no_worker_that_would_only_wait_and_warns_first(
    built_in: list[ScenarioComparison],
) -> None:
    [quota] = [c for c in built_in if c.quota_per_second is not None]
    mine = quota.leasebox
    assert quota.quota_workers == 3  # 50 msg/s at 20 msg/s a worker
    assert max(mine.replicas) <= 4
    assert max(max(b.replicas) for b in quota.baselines) > 10, "the baselines do not know"
    assert mine.worker_seconds < 0.5 * min(b.worker_seconds for b in quota.baselines)
    assert mine.warning is not None
    assert mine.first_over_sla is not None
    assert mine.warning[0] < mine.first_over_sla
    assert "backlog will exceed the SLA in" in mine.warning[1]
    assert "at the quota of 50/s" in mine.warning[1]


def test_the_quota_scenario_runs_alone_from_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--scenario", "provider-quota", "--duration", "1800", "--strict"]) == 0
    out = capsys.readouterr().out
    assert "PASS provider-quota     within-quota" in out
    assert "PASS provider-quota     warns-before-breach" in out
