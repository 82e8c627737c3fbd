"""The PromQL the project ships: alert rules and dashboard panels, read from their files.

Chart tests check their shape; the Prometheus test evaluates every expression against a
real server scraping real processes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES_FILE = ROOT / "charts" / "leasebox" / "files" / "alerts" / "leasebox-rules.yaml"
DASHBOARD_FILE = ROOT / "charts" / "leasebox" / "files" / "dashboards" / "leasebox-pool.json"
DEFAULT_VARIABLES = {"namespace": "mail", "pool": "otp", "__rate_interval": "1m"}


def exported_series() -> set[str]:
    """Every series name the worker, the operator and the feedback receivers export, as
    Prometheus stores them."""
    from leasebox.feedback.metrics import FeedbackMetrics
    from leasebox.runtime.metrics import WorkerMetrics
    from leasebox_operator.metrics import OperatorMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    registries = (WorkerMetrics().registry, OperatorMetrics().registry, FeedbackMetrics().registry)
    for registry in registries:
        for family in registry.collect():
            names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


def load_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recorded() -> dict[str, str]:
    """Recording rule name to PromQL expression."""
    return {rule["record"]: rule["expr"] for rule in load_rules() if "record" in rule}


def fleet_wide(expr: str) -> bool:
    """Whether an expression reads only recorded series (`leasebox:...`): about a provider
    account rather than a pool, it groups by neither namespace and pool."""
    return "leasebox:" in expr and re.search(r"\bleasebox_[a-z_]+", expr) is None


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in load_rules() if "alert" in rule]


def alert_expressions() -> dict[str, str]:
    """Alert name to PromQL expression, straight from the rules file."""
    return {rule["alert"]: rule["expr"] for rule in alerts()}


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return dashboard


def panels() -> list[dict[str, Any]]:
    return [p for p in load_dashboard()["panels"] if p["type"] != "row"]


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace Grafana's `$name` and `${name}` variables."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def dashboard_expressions(variables: dict[str, str] | None = None) -> dict[str, str]:
    """`panel title / legend` to PromQL, with the dashboard variables substituted."""
    variables = {**DEFAULT_VARIABLES, **(variables or {})}
    found: dict[str, str] = {}
    for panel in panels():
        for target in panel["targets"]:
            key = f"{panel['title']} / {target.get('legendFormat') or target['refId']}"
            found[key] = substitute(target["expr"], variables)
    return found
