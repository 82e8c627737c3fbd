"""The cluster tier: every test here runs against the session's real control plane.

They share one control plane, so they run in one test process (`xdist_group`), beside the
rest of the suite in the other. The chart is installed once per session, cluster-wide, and
its operator runs as a pod on the test node; each test works in a namespace of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from support.cluster.controlplane import ControlPlane
from support.cluster.kubelet import ProcessKubelet
from support.cluster.release import (
    CHART,
    OPERATOR_START_SECONDS,
    helm_client,
    operator_metrics,
    operator_values,
    running_operator_pods,
)
from support.cluster.rest import Rest
from support.pace import record_start_up, wait_for

RELEASE = "leasebox"
SYSTEM = "leasebox-system"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture(scope="session")
def release(control_plane: ControlPlane, kubelet: ProcessKubelet, kube: Rest) -> Iterator[str]:
    """`helm install` of the chart, cluster-wide, its operator running; yields its namespace."""
    with helm_client(control_plane, SYSTEM) as helm:
        helm.install(str(CHART), RELEASE, operator_values(), create_namespace=True, timeout=120)
        began = time.monotonic()
        wait_for(
            lambda: running_operator_pods(kube, kubelet, SYSTEM, RELEASE),
            what="the operator pod to run",
            timeout=OPERATOR_START_SECONDS,
        )
        wait_for(
            lambda: operator_metrics(kube, kubelet, SYSTEM, RELEASE),
            what="the operator's first answer (its metrics page)",
            timeout=OPERATOR_START_SECONDS,
        )
        record_start_up("the operator", time.monotonic() - began)
        yield SYSTEM
        helm.uninstall(RELEASE, ignore_not_found=True, timeout=120)
