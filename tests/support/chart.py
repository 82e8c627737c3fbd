"""Rendering the Helm chart in tests: real Helm (helm-python-sdk), the chart's files, and
small accessors over the rendered objects, shared by the chart's test modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "leasebox"
CRD_SOURCE = ROOT / "crds" / "outboxworkerpools.leasebox.dev.yaml"
CRD_COPY = CHART / "files" / "crds" / "outboxworkerpools.leasebox.dev.yaml"
RULES_FILE = CHART / "files" / "alerts" / "leasebox-rules.yaml"
DASHBOARD_FILE = CHART / "files" / "dashboards" / "leasebox-pool.json"
ALL_FEATURES = ROOT / "tests" / "chart" / "all-features-values.yaml"

RELEASE = "leasebox"
NAMESPACE = "leasebox-system"
# The oldest and the newest Kubernetes minor versions the chart supports.
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
# Custom resources: kubernetes-validate has no schema for them.
CUSTOM_KINDS = {"OutboxWorkerPool", "PodMonitor", "ServiceMonitor", "PrometheusRule"}
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)


def all_features_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(ALL_FEATURES.read_text())
    return values


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Render the chart as `helm template` would and return its objects."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    objects: list[dict[str, Any]] = []
    for path in sorted(manifests):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(manifests[path]) if doc)
    return objects


def render_notes(values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every Deployment and Pod among `objects`."""
    for obj in objects:
        if obj["kind"] == "Deployment":
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield obj["metadata"]["name"], obj["spec"]


# Every rendering test runs with the default values and with every feature switched on.
VALUE_SETS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "all-features": all_features_values(),
}
