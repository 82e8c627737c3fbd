"""The alert rules, one source for the chart and for every pool's PrometheusRule.

`rules/leasebox-rules.yaml` is a plain Prometheus rules file: the chart embeds a copy as
its fleet-wide PrometheusRule, and `pool_groups` turns the same alerts into one pool's
rules by adding `namespace` and `pool` matchers to every leasebox selector. The alert
names, labels, annotations and runbook links stay exactly the chart's, so a page reads
the same whichever object raised it (and Alertmanager merges the two, whose label sets
are equal). Alerts about the operator itself (`up` of its job) are fleet-wide only.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from importlib import resources
from typing import Any

import yaml

RULES_FILE = "leasebox-rules.yaml"
RUNBOOK_BASE = "https://github.com/leasebox/leasebox/blob/main/docs/runbooks.md"
_SELECTOR = re.compile(r"\b(leasebox_[a-z_]+)\b(\{[^}]*\})?")


@cache
def rules_text() -> str:
    """The rules file shipped with the operator."""
    return resources.files("leasebox_operator").joinpath("rules", RULES_FILE).read_text("utf-8")


@cache
def _parsed_groups(runbook_base_url: str) -> list[dict[str, Any]]:
    """The rules file parsed once per runbook base: every pool's resync builds its
    PrometheusRule from it, and parsing the YAML each time cost more than the poll."""
    text = rules_text().replace(RUNBOOK_BASE, runbook_base_url.rstrip("/"))
    groups: list[dict[str, Any]] = yaml.safe_load(text)["groups"]
    return groups


def rule_groups(runbook_base_url: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Every group of the rules file, with runbook links under `runbook_base_url` (a copy
    of its own for each caller)."""
    return copy.deepcopy(_parsed_groups(runbook_base_url))


def is_pool_alert(rule: dict[str, Any]) -> bool:
    """Whether an alert is about one pool (it reads leasebox series), not the operator."""
    return "alert" in rule and _SELECTOR.search(str(rule["expr"])) is not None


def narrow(expr: str, namespace: str, pool: str) -> str:
    """`expr` with `namespace` and `pool` matchers on every leasebox selector."""
    matchers = f'namespace="{namespace}",pool="{pool}"'

    def add(match: re.Match[str]) -> str:
        inner = (match.group(2) or "{}")[1:-1].strip()
        return f"{match.group(1)}{{{matchers}{',' + inner if inner else ''}}}"

    return _SELECTOR.sub(add, expr)


def pool_groups(
    namespace: str, pool: str, runbook_base_url: str = RUNBOOK_BASE
) -> list[dict[str, Any]]:
    """The pool alerts of the rules file, narrowed to one pool, group by group."""
    groups = []
    for group in rule_groups(runbook_base_url):
        rules = [
            {**rule, "expr": narrow(str(rule["expr"]), namespace, pool)}
            for rule in group["rules"]
            if is_pool_alert(rule)
        ]
        if rules:
            groups.append({**group, "rules": rules})
    return groups
