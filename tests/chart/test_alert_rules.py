"""The alert rules: promtool accepts them, unit tests cover every alert, runbooks exist.

The rules live in one plain Prometheus rules file that the chart's PrometheusRule embeds;
`alert_expressions()` hands its expressions to other tests as they are.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from monitoring_sources import (
    RULES_FILE,
    alert_expressions,
    alerts,
    exported_series,
    fleet_wide,
    load_rules,
    recorded,
)
from support.prometheus import required_tool

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
PROMTOOL_TESTS = sorted((Path(__file__).parent / "promtool").glob("*.yaml"))
RUNBOOK_BASE = "https://github.com/leasebox/leasebox/blob/main/docs/runbooks.md"


def promtool() -> str:
    return required_tool("promtool", "prometheus")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def runbook_anchors() -> set[str]:
    return {
        github_anchor(m.group(1))
        for m in re.finditer(r"^#{1,6} (.+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    }


def test_promtool_accepts_the_rules_file() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES_FILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(load_rules())} rules found" in result.stdout


@pytest.mark.parametrize("test_file", PROMTOOL_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        cwd=test_file.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_notice_a_changed_threshold(tmp_path: Path) -> None:
    """A rule change that breaks the SLA semantics makes the promtool tests fail."""
    mutated = RULES_FILE.read_text().replace("0.75 * max by", "0.5 * max by")
    assert mutated != RULES_FILE.read_text()
    (tmp_path / "rules.yaml").write_text(mutated)
    test_file = Path(__file__).parent / "promtool" / "sla.yaml"
    spec = yaml.safe_load(test_file.read_text())
    spec["rule_files"] = ["rules.yaml"]
    (tmp_path / "sla.yaml").write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool(), "test", "rules", "sla.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "LeaseboxVerificationSLAAtRisk" in result.stdout + result.stderr


def test_every_unit_test_file_loads_the_chart_rules_file() -> None:
    assert PROMTOOL_TESTS
    for test_file in PROMTOOL_TESTS:
        spec = yaml.safe_load(test_file.read_text())
        assert [(test_file.parent / f).resolve() for f in spec["rule_files"]] == [RULES_FILE]


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_stays_silent() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for test_file in PROMTOOL_TESTS:
        for test in yaml.safe_load(test_file.read_text())["tests"]:
            for check in test.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alert_expressions())
    assert sorted(names - fires) == []
    assert sorted(names - silent) == []
    assert (fires | silent) <= names, "a unit test names an alert that does not exist"


def test_every_alert_has_severity_summary_description_and_runbook_url() -> None:
    found = alerts()
    assert len(found) >= 10
    for alert in found:
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        for annotation in ("summary", "description", "runbook_url"):
            assert alert["annotations"].get(annotation, "").strip(), (alert["alert"], annotation)


def test_every_runbook_url_points_at_an_existing_runbook_section() -> None:
    anchors = runbook_anchors()
    for alert in alerts():
        base, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert base == RUNBOOK_BASE, alert["alert"]
        assert anchor == alert["alert"].lower()
        assert anchor in anchors, f"docs/runbooks.md has no section for {alert['alert']}"


def test_every_runbook_section_tells_meaning_impact_diagnosis_and_mitigation() -> None:
    sections = re.split(r"^## ", RUNBOOKS.read_text(), flags=re.MULTILINE)[1:]
    by_name = {section.splitlines()[0].strip(): section for section in sections}
    assert set(by_name) == set(alert_expressions())
    for name, section in by_name.items():
        for part in ("**Meaning.**", "**Impact.**", "**Diagnosis.**", "**Mitigation.**"):
            assert part in section, (name, part)


def test_the_alerts_read_only_metrics_leasebox_exports() -> None:
    known = exported_series()
    assert "leasebox_pool_max_replicas" in known
    records = recorded()
    assert "leasebox:feedback_bounce_rate:24h" in records
    for name, expr in {**alert_expressions(), **records}.items():
        used = set(re.findall(r"\bleasebox_[a-z_]+", expr))
        if 'up{job="leasebox-operator"}' in expr:
            continue  # about the operator's scrape target, not its metrics
        if fleet_wide(expr):  # reads series the rules file records
            assert set(re.findall(r"\bleasebox:[a-z_0-9:]+", expr)) <= set(records), name
            continue
        assert used, name
        assert sorted(used - known) == [], name


def test_pool_alerts_match_series_on_namespace_and_pool() -> None:
    for name, expr in alert_expressions().items():
        if "absent(" in expr or fleet_wide(expr):
            continue
        for grouping in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
            labels = {label.strip() for label in grouping.split(",")}
            assert {"namespace", "pool"} <= labels, (name, grouping)


def test_the_slo_alerts_read_the_60_second_bucket_the_worker_exports() -> None:
    from leasebox.runtime.metrics import WorkerMetrics

    worker = WorkerMetrics()
    worker.delivery_latency.labels("otp").observe(1.0)
    exposition = generate_latest(worker.registry).decode()
    buckets = re.findall(r'leasebox_delivery_latency_seconds_bucket\{[^}]*le="([^"]+)"', exposition)
    for name in ("LeaseboxDeliverySLOFastBurn", "LeaseboxDeliverySLOSlowBurn"):
        matchers = set(re.findall(r'le=~?"([^"]*)"', alert_expressions()[name]))
        assert len(matchers) == 1, name
        matcher = matchers.pop()
        # PromQL regular expressions are anchored, like fullmatch.
        assert [b for b in buckets if re.fullmatch(matcher, b)] in (["60"], ["60.0"])


def _pool_test() -> dict[str, object]:
    """A promtool test: pools otp and invite both breach; the otp rule fires for otp only."""
    series = [
        {"series": f'{name}{{namespace="mail",pool="{pool}"}}', "values": values}
        for pool in ("otp", "invite")
        for name, values in (
            ("leasebox_pool_sla_seconds", "60x10"),
            ("leasebox_pool_oldest_pending_timestamp_seconds", "1x10"),
        )
    ]
    breach = next(r for g in load_rules_groups() for r in g["rules"]
                  if r.get("alert") == "LeaseboxVerificationSLABreached")  # fmt: skip
    annotations = {
        "summary": "Pool mail/otp breaches its delivery SLA.",
        "description": "The oldest pending message of pool mail/otp has waited 4m 59s, longer "
        "than the pool's SLA (spec.sla.oldestPendingAgeSeconds). Users are waiting for their "
        "OTP and verification emails.",
        "runbook_url": breach["annotations"]["runbook_url"],
    }
    expected = {"exp_labels": {"severity": "critical", "namespace": "mail", "pool": "otp"},
                "exp_annotations": annotations}  # fmt: skip
    check = {"eval_time": "5m", "alertname": "LeaseboxVerificationSLABreached",
             "exp_alerts": [expected]}  # fmt: skip
    test = {"name": "the pool's rule fires for its pool only", "interval": "1m",
            "input_series": series, "alert_rule_test": [check]}  # fmt: skip
    return {"rule_files": ["pool-rules.yaml"], "evaluation_interval": "1m", "tests": [test]}


def load_rules_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return groups


def test_a_pools_prometheus_rule_checks_and_fires_for_that_pool_only(tmp_path: Path) -> None:
    """The operator's per-pool rule: the chart's alerts, narrowed to one pool."""
    from leasebox_operator import alerts

    groups = alerts.pool_groups("mail", "otp")
    (tmp_path / "pool-rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    checked = subprocess.run([promtool(), "check", "rules", "pool-rules.yaml"], cwd=tmp_path,
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(_pool_test()))
    tested = subprocess.run([promtool(), "test", "rules", "test.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    names = {rule["alert"] for group in groups for rule in group["rules"]}
    fleet = {name for name, expr in alert_expressions().items() if fleet_wide(expr)}
    assert {"LeaseboxBounceRateCritical", "LeaseboxGmailSpamRateHigh"} <= fleet
    assert names == set(alert_expressions()) - {"LeaseboxOperatorDown"} - fleet


def test_the_reputation_unit_tests_notice_a_changed_page_threshold(tmp_path: Path) -> None:
    """A bounce page moved from 5 % to 6 % leaves a 5.66 % bounce rate unpaged: a test fails."""
    text = RULES_FILE.read_text()
    mutated = text.replace(
        "leasebox:feedback_bounce_rate:24h > 0.05", "leasebox:feedback_bounce_rate:24h > 0.06"
    )
    assert mutated != text
    (tmp_path / "rules.yaml").write_text(mutated)
    spec = yaml.safe_load((Path(__file__).parent / "promtool" / "reputation.yaml").read_text())
    spec["rule_files"] = ["rules.yaml"]
    (tmp_path / "reputation.yaml").write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool(), "test", "rules", "reputation.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "LeaseboxBounceRateCritical" in result.stdout + result.stderr
