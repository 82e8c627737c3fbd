"""The chart installed with real Helm on the test control plane, and a pool as tests see it.

`install_chart` is `helm install` of `charts/leasebox` (helm-python-sdk, Helm as a
library) with the values a platform team would set, plus short operator timings so that
tests wait seconds, not minutes. The operator then runs as a pod of that release: the test
node runs it with a TokenRequest token of the chart's ServiceAccount, so every request it
makes is checked against the chart's RBAC.
"""

from __future__ import annotations

import base64
import copy
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import helm_python as helm

from support.cluster.controlplane import ROOT, ControlPlane
from support.cluster.kubelet import ProcessKubelet
from support.cluster.rest import Body, Rest
from support.pace import wait_for

CHART = ROOT / "charts" / "leasebox"
POOLS = ("leasebox.dev/v1alpha1", "outboxworkerpools")
# Short timings: resync, API retries and database connects in seconds rather than minutes.
FAST_OPERATOR_ENV = [
    {"name": "LEASEBOX_OPERATOR_CONNECT_TIMEOUT", "value": "1"},
    {"name": "LEASEBOX_OPERATOR_MAX_POLL_BACKOFF", "value": "1"},
    {"name": "LEASEBOX_OPERATOR_API_BACKOFFS", "value": "0.2,0.5,1"},
    {"name": "LEASEBOX_OPERATOR_RESYNC", "value": "2"},
    {"name": "LEASEBOX_OPERATOR_PEERING_LIFETIME", "value": "4"},
]
# How long a test waits for a new operator pod's first answer: process start-up (imports,
# login, the first watches), which a loaded machine stretches to many seconds.
OPERATOR_START_SECONDS = 90.0


def operator_values(**overrides: Any) -> dict[str, Any]:
    """Chart values: the chart's defaults but for fast timings and plain test images."""
    values: dict[str, Any] = {
        "image": {"tag": "test"},
        "operator": {"extraEnv": copy.deepcopy(FAST_OPERATOR_ENV)},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return values


@contextmanager
def helm_client(plane: ControlPlane, namespace: str) -> Iterator[helm.Config]:
    config = helm.Config(kubeconfig_path=plane.admin_kubeconfig, namespace=namespace)
    try:
        yield config
    finally:
        config.close()


# Pods that select a node no one has stay Pending, as on a full cluster: the operator's
# decisions are then the only thing that moves.
PENDING = {"podTemplate": {"spec": {"nodeSelector": {"leasebox.dev/node": "none"}}}}


def pool_body(
    name: str, namespace: str, *, scaling: Body, pending: bool = True, **sections: Any
) -> Body:
    """An OutboxWorkerPool of `otp` reading the `leasebox-database` and `-provider` Secrets."""
    spec: Body = {
        "kinds": ["otp"],
        "database": {"secretRef": {"name": "leasebox-database"}},
        "provider": {"secretRef": {"name": "leasebox-provider"}},
        **sections,
        "scaling": scaling,
    }
    if pending:
        spec["worker"] = copy.deepcopy(PENDING)
    return {
        "apiVersion": "leasebox.dev/v1alpha1",
        "kind": "OutboxWorkerPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def secret(name: str, key: str, value: str, namespace: str) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": {key: base64.b64encode(value.encode()).decode()},
    }


def operator_pods(kube: Rest, namespace: str, release: str) -> list[Body]:
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
    return kube.list("v1", "pods", namespace, labelSelector=selector)


def running_operator_pods(
    kube: Rest, kubelet: ProcessKubelet, namespace: str, release: str
) -> list[str]:
    """Names of the release's operator pods whose process runs on the node."""
    return [
        pod["metadata"]["name"]
        for pod in operator_pods(kube, namespace, release)
        if not pod["metadata"].get("deletionTimestamp")
        and (runner := kubelet.runner(namespace, pod["metadata"]["name"])) is not None
        and any(c.process and c.exit_code is None for c in runner.containers)
    ]


def operator_log(kubelet: ProcessKubelet, namespace: str) -> str:
    """Every operator container's log in `namespace` so far, pod after pod."""
    return "\n".join(
        runner.log("operator")
        for runner in kubelet.runners(namespace)
        if any(c.name == "operator" for c in runner.containers)
    )


class Pool:
    """One OutboxWorkerPool and its children, read through the API as the administrator."""

    def __init__(self, kube: Rest, name: str, namespace: str) -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.deployment_name = f"{name}-worker"

    def get(self) -> Body | None:
        return self.kube.get(*POOLS, self.name, self.namespace)

    def status(self) -> Body:
        return dict((self.get() or {}).get("status") or {})

    def condition(self, kind: str) -> Body | None:
        return next((c for c in self.status().get("conditions", []) if c["type"] == kind), None)

    def condition_is(self, kind: str, status: str, reason: str | None = None) -> bool:
        found = self.condition(kind)
        return bool(found and found["status"] == status and reason in (None, found["reason"]))

    def deployment(self) -> Body | None:
        return self.kube.get("apps/v1", "deployments", self.deployment_name, self.namespace)

    def replicas(self) -> int | None:
        found = self.deployment()
        return None if found is None else int(found["spec"].get("replicas", 0))

    def ready_pods(self) -> int:
        found = self.deployment() or {}
        return int((found.get("status") or {}).get("readyReplicas", 0))

    def patch_spec(self, spec: Body) -> None:
        self.kube.merge_patch(*POOLS, self.name, {"spec": spec}, self.namespace)

    def events(self) -> list[Body]:
        found = [
            e
            for e in self.kube.list("v1", "events", self.namespace)
            if (e.get("involvedObject") or {}).get("name") == self.name
        ]
        return sorted(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))

    def event_reasons(self) -> list[str]:
        return [str(e.get("reason")) for e in self.events()]

    def wait_condition(
        self, kind: str, status: str, reason: str | None = None, timeout: float = 60
    ) -> None:
        wait_for(
            lambda: self.condition_is(kind, status, reason),
            what=f"{kind}={status} {reason or ''} on pool {self.name}",
            timeout=timeout,
        )


def operator_metrics(kube: Rest, kubelet: ProcessKubelet, namespace: str, release: str) -> str:
    """The metrics page of the release's running operator pod (the first, if several)."""
    pods = running_operator_pods(kube, kubelet, namespace, release)
    if not pods:
        return ""
    port = kubelet.host_port(namespace, pods[0], "http-metrics")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def sample(metrics: str, name: str) -> float:
    """The value of one sample of a metrics page (0 while it is absent)."""
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
