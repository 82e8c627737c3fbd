"""`leasebox demo` shows the alerts: a real Prometheus evaluates the chart's rules on the
demo's operator and workers, and the report says plainly whether the SLA was met.

The run here has a long provider outage and a short SLA, so the verification SLA is breached;
Prometheus's own HTTP API must show `LeaseboxVerificationSLABreached` firing during the
outage and no longer firing once the backlog has drained. The wording of the verdict and the
rules the demo loads are checked on their own.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml

from leasebox.demo.monitoring import SHORT_FOR, AlertSpan, demo_rules
from leasebox.demo.report import Summary
from leasebox.demo.sla import account, breaches, render_sla
from support.chart import ROOT, RULES_FILE

SLA_ALERT = "LeaseboxVerificationSLABreached"


def test_the_demo_loads_the_charts_rules_with_only_their_for_shortened() -> None:
    chart = yaml.safe_load(RULES_FILE.read_text())
    demo = yaml.safe_load(demo_rules(RULES_FILE.read_text()))
    chart_rules = [r for g in chart["groups"] for r in g["rules"]]
    demo_rules_ = [r for g in demo["groups"] for r in g["rules"]]
    assert len(demo_rules_) == len(chart_rules) > 5
    for ours, theirs in zip(demo_rules_, chart_rules, strict=True):
        assert {k: v for k, v in ours.items() if k != "for"} == {
            k: v for k, v in theirs.items() if k != "for"
        }
        assert ours.get("for") == (SHORT_FOR if "for" in theirs else None)


def test_breaches_are_the_stretches_over_the_sla() -> None:
    samples = [(0.0, 1.0), (1.0, 11.0), (2.0, 12.0), (3.0, 4.0), (4.0, 10.0), (5.0, 10.5)]
    assert breaches(samples, 10.0) == ((1.0, 3.0), (5.0, None))
    assert breaches([(0.0, 10.0)], 10.0) == ()


def test_the_report_says_plainly_whether_the_sla_was_met() -> None:
    alerts = (AlertSpan(SLA_ALERT, "critical", 21.0, 58.0),)
    timeline = [(13.0, "the SMTP server starts answering 451 (transient)")]
    missed = account(
        [(20.0, 9.0), (21.0, 38.0), (58.0, 2.0)],
        10.0,
        alerts=alerts,
        timeline=timeline,
        monitoring="Prometheus",
    )
    lines = render_sla(missed, late=40, delivered=900, p99=38.0, worst=39.5)
    assert lines[1] == (
        "SLA MISSED: 40 of 900 messages took longer than 10 s to be sent (p99 38.0 s, max "
        "39.5 s); the oldest pending message waited up to 38.0 s, over the SLA for 37 s "
        "(t=21s to t=58s)."
    )
    assert lines[4:] == [
        "  t=  13.0s           the SMTP server starts answering 451 (transient)",
        f"  t=  21.0s  FIRED    {SLA_ALERT} (critical)",
        f"  t=  58.0s  cleared  {SLA_ALERT}",
    ]
    met = account([(0.0, 1.0)], 10.0, monitoring="none: prometheus was not found")
    assert render_sla(met, late=0, delivered=5, p99=0.5, worst=0.6)[1:] == [
        "SLA met: every message was sent within 10 s of being enqueued (p99 0.5 s, max 0.6 s); "
        "the oldest pending message waited up to 1.0 s.",
        "",
        "Alerts (none: prometheus was not found)",
    ]


def _query_range(base: str, expr: str, start: float, end: float) -> list[float]:
    """The timestamps at which `expr` had a value, from Prometheus's HTTP API."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=10) as answer:
        body: dict[str, Any] = json.load(answer)
    assert body["status"] == "success"
    return sorted(float(t) for series in body["data"]["result"] for t, _ in series["values"])


@pytest.mark.slow
async def test_the_sla_alert_fires_during_the_outage_and_clears_after() -> None:
    from leasebox.cli.demo import observatory
    from leasebox.demo.run import DemoSettings, run_demo
    from leasebox.demo.scenario import Scenario

    if shutil.which("prometheus") is None and not os.environ.get("CI"):
        pytest.skip("prometheus is not on the PATH: `make tools` installs it")
    watching = observatory(no_alerts=False, progress=io.StringIO())
    assert watching is not None
    scenario = dataclasses.replace(Scenario.shortened(30), failure_seconds=14.0)
    data_dir = ROOT / "build" / f"test-demo-alerts-{os.getpid()}"
    settings = DemoSettings(
        data_dir=data_dir, scenario=scenario, sla_seconds=3.0, observatory=watching
    )
    seen: dict[str, Any] = {}

    def report(summary: Summary) -> None:  # called while Prometheus still runs
        assert summary.sla is not None
        started = summary.sla.traffic_started_at
        seen["firing"] = _query_range(
            watching.url,
            f'ALERTS{{alertname="{SLA_ALERT}",alertstate="firing"}}',
            started,
            time.time(),
        )
        seen["started"] = started
        seen["summary"] = summary

    try:
        summary = await run_demo(settings, io.StringIO(), False, report)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    firing, started = seen["firing"], seen["started"]
    outage = (started + scenario.failure_start, started + scenario.failure_end)
    assert firing, "Prometheus never fired the SLA alert"
    assert outage[0] < firing[0] < outage[1], (firing[0] - started, scenario.failure_end)
    assert firing[-1] < time.time() - 1, "the SLA alert was still firing at the end"
    assert summary.sla is not None
    (span,) = [a for a in summary.sla.alerts if a.name == SLA_ALERT]
    assert span.cleared_at is not None
    # The workers are scraped too: the outage's retries raise the alert on their counters.
    assert "LeaseboxRetryRatioHigh" in {a.name for a in summary.sla.alerts}
    assert not summary.sla.met
    assert summary.lost == ()
