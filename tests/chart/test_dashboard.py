"""The Grafana pool dashboard: its panels, its variables, and PromQL that Prometheus parses.

`dashboard_expressions()` hands every panel query to other tests with the dashboard
variables replaced by real values.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring_sources import (
    dashboard_expressions,
    exported_series,
    fleet_wide,
    load_dashboard,
    panels,
    recorded,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_dashboard_selects_a_pool_within_a_namespace() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "leasebox_pool_sla_seconds" in variables["namespace"]["definition"]
    assert variables["pool"]["definition"] == (
        'label_values(leasebox_pool_sla_seconds{namespace="$namespace"}, pool)'
    )


def test_every_panel_queries_prometheus_through_the_datasource_variable() -> None:
    for panel in panels():
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


def test_every_pool_panel_filters_on_the_selected_pool() -> None:
    for key, expr in dashboard_expressions({"namespace": "NS", "pool": "POOL"}).items():
        if "leasebox_operator_poll_duration_seconds" in expr:
            continue  # one histogram for all pools of the operator
        if fleet_wide(expr):  # a provider account's reputation: the namespace's accounts
            assert 'namespace="NS"' in expr, key
            continue
        selectors = re.findall(r"\bleasebox_[a-z_]+\{([^}]*)\}", expr)
        assert selectors, key
        for selector in selectors:
            assert 'namespace="NS"' in selector, key
            assert 'pool="POOL"' in selector, key


def test_the_dashboard_has_the_panels_an_operator_needs() -> None:
    exprs = "\n".join(dashboard_expressions().values())
    titles = [p["title"] for p in panels()]
    assert "Oldest pending age against the SLA" in titles
    assert "Backlog by state" in titles
    assert "Arrival and send rates" in titles
    assert "Retries by error class" in titles
    assert "Dead letters by reason" in titles
    assert "Replicas: desired against actual" in titles
    for quantile in ("0.5", "0.95", "0.99"):
        assert (
            f"histogram_quantile({quantile}, sum by (le) "
            "(rate(leasebox_delivery_latency_seconds_bucket" in exprs
        )
    assert "leasebox_pool_desired_replicas" in exprs
    assert "leasebox_pool_replicas{" in exprs
    assert "Hard-bounce rate by provider and sending domain" in titles
    assert "leasebox:feedback_complaint_rate:24h" in exprs


def test_panels_do_not_overlap_and_fit_the_grid() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in load_dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells
    ids = [p["id"] for p in load_dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_reads_only_metrics_leasebox_exports() -> None:
    known = exported_series()
    records = recorded()
    for key, expr in dashboard_expressions().items():
        if fleet_wide(expr):
            assert set(re.findall(r"\bleasebox:[a-z_0-9:]+", expr)) <= set(records), key
            continue
        used = set(re.findall(r"\bleasebox_[a-z_]+", expr))
        assert used, key
        assert sorted(used - known) == [], key


def test_prometheus_parses_every_panel_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: install the Debian package prometheus")
        pytest.skip("promtool is missing (Debian package prometheus)")
    expressions = dashboard_expressions()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"leasebox:dashboard_query_{i}:check", "expr": expr}
                    for i, expr in enumerate(expressions.values())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in result.stdout
