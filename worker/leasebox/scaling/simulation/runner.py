"""`leasebox simulate`: the scaling policy against faithful HPA baselines, on the same load.

A scaling policy is only as good as its worst afternoon, and a cluster is a
slow and costly place to find that out. This replays built-in scenarios or a
CSV trace through the code the operator runs (`leasebox.scaling.policy.decide`, one
default configuration for every scenario) and through KEDA-style HPAs swept
over their targets, then reports seconds over the SLA, the worst age,
worker-seconds and scale events per setting, marks the Pareto front, and
checks the policy's three claims so a regression shows up as a failed verdict
with its figures, not as a surprise in production.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from leasebox.scaling.simulation.engine import RunResult, SimulationConfig, run_simulation
from leasebox.scaling.simulation.report import (
    Claim,
    ScenarioComparison,
    compare,
    format_table,
    format_verdicts,
    plot,
    policy_verdicts,
    to_json,
)
from leasebox.scaling.simulation.scenarios import (
    BURST_SCENARIOS,
    QUOTAS,
    SCENARIOS,
    TraceError,
    Workload,
    build_workload,
    load_trace,
    rates_from_trace,
)

__all__ = [
    "Claim",
    "RunResult",
    "ScenarioComparison",
    "SimulationConfig",
    "compare",
    "format_table",
    "main",
    "plot",
    "policy_verdicts",
    "run_simulation",
    "scenario_workload",
    "to_json",
]


def scenario_workload(name: str, config: SimulationConfig) -> Workload:
    """The workload of a built-in scenario."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    description, rate, speed = SCENARIOS[name]
    return build_workload(
        name,
        description,
        rate,
        speed,
        duration=config.duration_seconds,
        seed=config.seed,
        worker_throughput=config.worker_throughput,
        quota_per_second=QUOTAS.get(name),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leasebox simulate",
        description=(
            "Simulate one worker pool under the leasebox scaling policy (the operator's own "
            "code, default configuration) and under KEDA-style HPA baselines swept over their "
            "targets, on the same arrivals and the same random draws. Reports seconds over the "
            "SLA, worst oldest age, worker-seconds and scale events, marks the Pareto front "
            "(*), and checks the policy's claims."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--scenario",
        default="all",
        choices=[*SCENARIOS, "all"],
        help="built-in scenario to run (default: all)",
    )
    source.add_argument(
        "--trace",
        type=Path,
        metavar="CSV",
        help="arrival trace: a CSV with header t_seconds,arrivals_per_second; each rate holds "
        "until the next row",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    parser.add_argument(
        "--duration",
        type=int,
        metavar="SECONDS",
        help="simulated seconds (default: 3600; a trace: its last t_seconds plus 600)",
    )
    parser.add_argument(
        "--sla",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="SLA on the oldest ready age (default: 60)",
    )
    parser.add_argument(
        "--startup",
        type=int,
        default=20,
        metavar="SECONDS",
        help="pod start-up delay (default: 20)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--plot", type=Path, metavar="FILE", help="write a PNG chart of age and replicas over time"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 when a claim of the policy fails"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        comparisons, config = _run(args)
    except (TraceError, ValueError) as error:
        print(f"leasebox simulate: {error}", file=sys.stderr)
        return 2
    claims = policy_verdicts(comparisons)
    if args.json:
        print(to_json(comparisons, config))
    else:
        print(format_table(comparisons))
        print(format_verdicts(claims, comparisons))
    if args.plot is not None:
        plot(comparisons, args.plot, config.sla_seconds)
    return 1 if args.strict and not all(c.holds for c in claims) else 0


def _run(args: argparse.Namespace) -> tuple[list[ScenarioComparison], SimulationConfig]:
    if args.trace is not None:
        points = load_trace(args.trace)
        duration = args.duration or int(points[-1].t_seconds) + 600
        config = SimulationConfig(
            duration_seconds=duration,
            seed=args.seed,
            sla_seconds=args.sla,
            startup_seconds=args.startup,
        )
        workload = build_workload(
            args.trace.name,
            f"trace {args.trace}",
            rates_from_trace(points),
            lambda t, d: 1.0,
            duration=duration,
            seed=args.seed,
            worker_throughput=config.worker_throughput,
        )
        return [compare(workload, config)], config
    config = SimulationConfig(
        duration_seconds=args.duration or 3600,
        seed=args.seed,
        sla_seconds=args.sla,
        startup_seconds=args.startup,
    )
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    return [
        compare(scenario_workload(n, config), config, burst=n in BURST_SCENARIOS) for n in names
    ], config


if __name__ == "__main__":
    raise SystemExit(main())
