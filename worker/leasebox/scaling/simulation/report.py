"""The reports of `leasebox simulate`: comparisons, the policy's claims, table, JSON, chart.

The claims are checked in code, not eyeballed in a chart, so that a change to
the policy or to the baselines that breaks one shows up as a failed verdict
with its figures. The chart is optional and matplotlib is imported only when
one is asked for, so the command needs nothing beyond the standard library.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from leasebox.scaling.simulation.engine import (
    RunResult,
    SimulationConfig,
    controllers,
    run_simulation,
)
from leasebox.scaling.simulation.scenarios import Workload

__all__ = [
    "DOMINANCE_MARGIN",
    "Claim",
    "ScenarioComparison",
    "baselines_meeting_sla_everywhere",
    "compare",
    "format_table",
    "format_verdicts",
    "plot",
    "policy_verdicts",
    "to_json",
]

DOMINANCE_MARGIN = 0.05
"""A baseline must beat the policy by more than this share of worker-seconds to count."""


@dataclass(frozen=True)
class ScenarioComparison:
    """Every policy setting on one workload."""

    scenario: str
    description: str
    burst: bool
    results: tuple[RunResult, ...]
    quota_per_second: float | None = None
    quota_workers: int | None = None
    """The workers the quota keeps busy at the nominal per-worker throughput."""

    @property
    def leasebox(self) -> RunResult:
        """The leasebox policy's result."""
        return next(r for r in self.results if r.policy == "leasebox")

    @property
    def baselines(self) -> tuple[RunResult, ...]:
        """The HPA settings' results."""
        return tuple(r for r in self.results if r.policy != "leasebox")


@dataclass(frozen=True)
class Claim:
    """One claim of the policy on one scenario.

    Attributes:
        scenario: the workload.
        name: "meets-sla", "cheapest-on-bursts", "not-dominated", and under a provider
            quota "within-quota" and "warns-before-breach".
        applicable: False where the claim is not made (cheapest only on bursts; the SLA
            where arrivals exceed the quota, which no policy can meet).
        holds: whether it holds (True when not applicable).
        detail: the figures behind the verdict.
    """

    scenario: str
    name: str
    applicable: bool
    holds: bool
    detail: str


def _pareto(results: Sequence[RunResult]) -> tuple[RunResult, ...]:
    def dominated(r: RunResult) -> bool:
        return any(
            o.seconds_over_sla <= r.seconds_over_sla
            and o.worker_seconds <= r.worker_seconds
            and (o.seconds_over_sla, o.worker_seconds) != (r.seconds_over_sla, r.worker_seconds)
            for o in results
        )

    return tuple(replace(r, on_pareto_front=not dominated(r)) for r in results)


def compare(
    workload: Workload, config: SimulationConfig, *, burst: bool = False
) -> ScenarioComparison:
    """Run every policy setting on one workload, on the same arrivals and noise."""
    quota = workload.quota_per_second
    results = [run_simulation(workload, c, config) for c in controllers(config, quota)]
    workers = None if quota is None else math.ceil(quota / config.worker_throughput)
    return ScenarioComparison(
        workload.name, workload.description, burst, _pareto(results), quota, workers
    )


def _fmt(result: RunResult) -> str:
    return (
        f"{result.policy} {result.setting}: {result.seconds_over_sla}s over SLA, "
        f"{result.worker_seconds:.0f} worker-s"
    )


def policy_verdicts(comparisons: Sequence[ScenarioComparison]) -> list[Claim]:
    """Check the policy's three claims on every scenario, with the figures."""
    claims: list[Claim] = []
    for comp in comparisons:
        mine = comp.leasebox
        figures = (
            f"{mine.seconds_over_sla}s over SLA, worst oldest age "
            f"{mine.max_oldest_age_seconds:.1f}s"
        )
        if comp.quota_per_second is None:
            claims.append(
                Claim(comp.scenario, "meets-sla", True, mine.seconds_over_sla == 0, figures)
            )
        else:
            figures = f"arrivals exceed the quota of {comp.quota_per_second:g}/s: {figures}"
            claims.append(Claim(comp.scenario, "meets-sla", False, True, figures))
            claims += _quota_claims(comp)
        if comp.burst:
            beaten = [
                b
                for b in comp.baselines
                if b.worker_seconds <= mine.worker_seconds
                or b.seconds_over_sla < mine.seconds_over_sla
            ]
            cheapest = min(comp.baselines, key=lambda b: b.worker_seconds)
            detail = f"{mine.worker_seconds:.0f} worker-s, {mine.seconds_over_sla}s over SLA; "
            detail += (
                "not beaten by: " + "; ".join(_fmt(b) for b in beaten)
                if beaten
                else f"cheapest baseline {_fmt(cheapest)}"
            )
            claims.append(Claim(comp.scenario, "cheapest-on-bursts", True, not beaten, detail))
        else:
            claims.append(
                Claim(comp.scenario, "cheapest-on-bursts", False, True, "not a burst scenario")
            )
        better = [
            b
            for b in comp.baselines
            if b.seconds_over_sla <= mine.seconds_over_sla
            and b.worker_seconds < (1 - DOMINANCE_MARGIN) * mine.worker_seconds
        ]
        peers = [b for b in comp.baselines if b.seconds_over_sla <= mine.seconds_over_sla]
        if better:
            detail = "dominated by: " + "; ".join(_fmt(b) for b in better)
        elif peers:
            best = min(peers, key=lambda b: b.worker_seconds)
            ratio = mine.worker_seconds / best.worker_seconds
            detail = f"cheapest peer {_fmt(best)} ({ratio:.2f}x of its worker-s)"
        else:
            detail = "every baseline setting is over the SLA for longer"
        claims.append(Claim(comp.scenario, "not-dominated", True, not better, detail))
    return claims


def _quota_claims(comp: ScenarioComparison) -> list[Claim]:
    """Under a quota: no more workers than it keeps busy, and a warning before the breach."""
    mine = comp.leasebox
    most = max(mine.replicas, default=0)
    allowed = (comp.quota_workers or 0) + 1  # measured throughput runs a little under nominal
    within = Claim(
        comp.scenario,
        "within-quota",
        True,
        most <= allowed,
        f"at most {most} replicas; the quota keeps {comp.quota_workers} busy at the nominal "
        f"throughput; the baselines asked for up to "
        f"{max((max(b.replicas, default=0) for b in comp.baselines), default=0)}",
    )
    breach, warning = mine.first_over_sla, mine.warning
    if breach is None:
        detail, holds = "the SLA was never breached", True
    elif warning is None:
        detail, holds = f"over the SLA from {breach}s on without a quota warning", False
    else:
        detail = f"warned at {warning[0]:.0f}s, {breach - warning[0]:.0f}s before the breach: "
        detail += warning[1]
        holds = warning[0] <= breach
    return [within, Claim(comp.scenario, "warns-before-breach", True, holds, detail)]


def baselines_meeting_sla_everywhere(comparisons: Sequence[ScenarioComparison]) -> list[str]:
    """Baseline settings with zero seconds over the SLA on every scenario (ideally none)."""
    if not comparisons:
        return []
    keys = [(r.policy, r.setting) for r in comparisons[0].baselines]
    return [
        f"{policy} {setting}"
        for policy, setting in keys
        if all(
            r.seconds_over_sla == 0
            for c in comparisons
            for r in c.baselines
            if (r.policy, r.setting) == (policy, setting)
        )
    ]


def format_table(comparisons: Sequence[ScenarioComparison]) -> str:
    """A plain-text table: one block per scenario, `*` marking the Pareto front."""
    header = (
        f"{'policy':<12} {'setting':<26} {'s over SLA':>10} {'max age s':>10} "
        f"{'worker-s':>10} {'scalings':>8}  pareto"
    )
    lines: list[str] = []
    for comp in comparisons:
        lines += [f"== {comp.scenario}: {comp.description}", header]
        for r in comp.results:
            lines.append(
                f"{r.policy:<12} {r.setting:<26} {r.seconds_over_sla:>10} "
                f"{r.max_oldest_age_seconds:>10.1f} {r.worker_seconds:>10.0f} "
                f"{r.scale_events:>8}  {'*' if r.on_pareto_front else ''}"
            )
        lines.append("")
    return "\n".join(lines)


def format_verdicts(claims: Sequence[Claim], comparisons: Sequence[ScenarioComparison]) -> str:
    """One line per claim and scenario, then the baselines that meet the SLA everywhere."""
    lines = []
    for claim in claims:
        mark = "n/a " if not claim.applicable else ("PASS" if claim.holds else "FAIL")
        lines.append(f"{mark} {claim.scenario:<18} {claim.name:<19} {claim.detail}")
    everywhere = baselines_meeting_sla_everywhere(comparisons)
    lines.append(
        "baseline settings meeting the SLA on every scenario: "
        + (", ".join(everywhere) if everywhere else "none")
    )
    return "\n".join(lines)


def to_json(comparisons: Sequence[ScenarioComparison], config: SimulationConfig) -> str:
    """The comparison and the verdicts as a JSON document (no per-second timelines)."""
    claims = policy_verdicts(comparisons)
    document: dict[str, Any] = {
        "config": {
            "duration_seconds": config.duration_seconds,
            "seed": config.seed,
            "sla_seconds": config.sla_seconds,
            "startup_seconds": config.startup_seconds,
            "worker_throughput": config.worker_throughput,
            "min_replicas": config.min_replicas,
            "max_replicas": config.max_replicas,
        },
        "scenarios": [
            {
                "name": comp.scenario,
                "description": comp.description,
                "burst": comp.burst,
                "quota_per_second": comp.quota_per_second,
                "results": [
                    {
                        "policy": r.policy,
                        "setting": r.setting,
                        "seconds_over_sla": r.seconds_over_sla,
                        "max_oldest_age_seconds": round(r.max_oldest_age_seconds, 3),
                        "worker_seconds": round(r.worker_seconds, 3),
                        "scale_events": r.scale_events,
                        "on_pareto_front": r.on_pareto_front,
                    }
                    for r in comp.results
                ],
                "claims": [
                    {
                        "name": c.name,
                        "applicable": c.applicable,
                        "holds": c.holds,
                        "detail": c.detail,
                    }
                    for c in claims
                    if c.scenario == comp.scenario
                ],
            }
            for comp in comparisons
        ],
        "baselines_meeting_sla_everywhere": baselines_meeting_sla_everywhere(comparisons),
        "all_claims_hold": all(c.holds for c in claims),
    }
    return json.dumps(document, indent=2, ensure_ascii=False)


def _shown(comp: ScenarioComparison) -> list[RunResult]:
    """The policy and, per baseline family, its setting with the least SLA breach, then cost."""
    shown = [comp.leasebox]
    for family in ("hpa-backlog", "hpa-age"):
        members = [r for r in comp.baselines if r.policy == family]
        if members:
            shown.append(min(members, key=lambda r: (r.seconds_over_sla, r.worker_seconds)))
    return shown


def plot(comparisons: Sequence[ScenarioComparison], path: Path, sla_seconds: float) -> None:
    """Write a PNG: oldest age and replicas over time, per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = max(1, len(comparisons))
    figure, axes = pyplot.subplots(rows, 2, figsize=(14, 3.2 * rows), squeeze=False)
    for row, comp in enumerate(comparisons):
        age_axis, replica_axis = axes[row]
        for r in _shown(comp):
            label = f"{r.policy} {r.setting}"
            age_axis.plot(r.oldest_age, label=label, linewidth=0.9)
            replica_axis.plot(r.replicas, label=label, linewidth=0.9, drawstyle="steps-post")
        age_axis.axhline(sla_seconds, color="red", linestyle="--", linewidth=0.8, label="SLA")
        age_axis.set_title(f"{comp.scenario}: oldest ready age (s)")
        replica_axis.set_title(f"{comp.scenario}: replicas requested")
        for axis in (age_axis, replica_axis):
            axis.set_xlabel("time (s)")
            axis.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=90)
    pyplot.close(figure)
