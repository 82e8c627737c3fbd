"""`leasebox demo`: run the whole flow locally and exit 0 only if the guarantees held.

Exit codes: 0 the guarantees held, 1 a guarantee was violated (the reasons are printed),
2 the demo could not run (a missing extra, a port, a database that would not start).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_VIOLATED = 1
QUICK_DURATION = 25.0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole flow on an embedded PostgreSQL and check what leasebox guarantees",
        description="Start an embedded PostgreSQL, an SMTP server, a reference OTP API and a "
        "pool of workers scaled by the operator's policy; play a login burst with client "
        "retries, a provider outage, a bounced address and a worker killed mid-send; print "
        "what was accepted, delivered, duplicated and why. Exits 0 only when no accepted send "
        "was lost and every duplicate has a crash or lease loss behind it.",
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--duration",
        type=_duration,
        default=60.0,
        help="seconds of traffic; shorter runs scale the whole timeline (default: 60)",
    )
    length.add_argument(
        "--quick",
        action="store_const",
        dest="duration",
        const=QUICK_DURATION,
        help=f"a shortened run ({QUICK_DURATION:g}s of traffic)",
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="after the summary, leave the API, the workers' metrics and the database up",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("build/leasebox-demo"),
        help="where the embedded PostgreSQL and the worker logs live "
        "(default: build/leasebox-demo, created fresh each run)",
    )
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="reuse the cluster already in --data-dir instead of starting from scratch",
    )
    parser.add_argument(
        "--seed", type=int, default=7, help="seed of the request schedule (default: 7)"
    )
    parser.add_argument(
        "--no-live",
        action="store_true",
        help="plain progress lines instead of a refreshed status line "
        "(the default when stdout is not a terminal)",
    )
    parser.add_argument(
        "--sla",
        type=_duration_of("SLA", 1, 120),
        default=10.0,
        metavar="SECONDS",
        help="the oldest pending message's SLA the pool is scaled to and judged by (default: 10)",
    )
    parser.add_argument(
        "--no-alerts",
        action="store_true",
        help="run without Prometheus and the chart's alerts (by default they run when a "
        "prometheus binary is on the PATH)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the summary as JSON on stdout (progress goes to stderr)",
    )
    parser.set_defaults(func=run)


def _duration_of(what: str, low: float, high: float) -> Any:
    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
        if not low <= seconds <= high:
            raise argparse.ArgumentTypeError(f"the {what} must be between {low} and {high} s")
        return seconds

    return parse


def observatory(no_alerts: bool, progress: Any) -> Any:
    """Prometheus, the chart's rules and the operator's metrics, or None without alerts.

    A missing `prometheus` binary is one line and a run without alerts, except under `CI`,
    where the alerts are part of what is checked.
    """
    import os

    from leasebox.demo.monitoring import Observatory, find_prometheus
    from leasebox.errors import ConfigurationError

    if no_alerts:
        return None
    binary = find_prometheus()
    if binary is None:
        if os.environ.get("CI"):
            raise ConfigurationError(
                "prometheus is not on the PATH: `make tools` installs Debian's prometheus"
            )
        print(
            "leasebox demo: no prometheus on the PATH, so no alerts this run "
            "(`make tools` installs Debian's prometheus)",
            file=progress,
        )
        return None
    from leasebox_operator.alerts import rules_text
    from leasebox_operator.metrics import OperatorMetrics

    return Observatory(binary, rules_text(), OperatorMetrics())


def _duration(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 15 <= seconds <= 600:
        raise argparse.ArgumentTypeError("the duration must be between 15 and 600 seconds")
    return seconds


def run(args: argparse.Namespace) -> int:
    import asyncio

    from leasebox.errors import ConfigurationError

    try:
        from leasebox.demo.run import DemoSettings, run_demo
    except ImportError as exc:
        raise ConfigurationError(
            f"the demo needs {exc.name or 'its extra'}: pip install 'leasebox[demo]'"
        ) from None
    from leasebox.demo.report import Summary, render, verdict
    from leasebox.demo.scenario import Scenario

    scenario = Scenario() if args.duration == 60.0 else Scenario.shortened(args.duration)
    progress = sys.stderr if args.json else sys.stdout
    settings = DemoSettings(
        data_dir=args.data_dir,
        keep_data=args.keep_data,
        keep_running=args.keep_running,
        scenario=scenario,
        seed=args.seed,
        sla_seconds=args.sla,
        observatory=observatory(args.no_alerts, progress),
    )
    live = progress.isatty() and not args.no_live

    def report(summary: Summary) -> None:
        if args.json:
            print(json.dumps(summary.as_dict(), indent=2, default=str))
        else:
            print()
            print(render(summary))
        sys.stdout.flush()

    summary = asyncio.run(run_demo(settings, progress, live, report))
    reasons = verdict(summary)
    if reasons:
        print(f"leasebox demo: guarantees violated: {'; '.join(reasons)}", file=sys.stderr)
        return EXIT_VIOLATED
    return 0
