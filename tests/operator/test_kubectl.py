"""What `kubectl` shows of a pool the operator runs, with the real kubectl binary.

The emulated API serves the Table format from the CRD's printer columns, as the API server
does, so `kubectl get owp` and `kubectl get owp -o wide` print exactly what a user would
see; `kubectl scale owp` goes through the pool's scale subresource, and in scaling mode
External the operator follows it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.kube.emulator import KubeEmulator
from support.kube.harness import OPERATOR_START_SECONDS, POOLS, Cluster, running_operator
from support.waiting import wait_for

NAME = "otp"
POOL: dict[str, Any] = {
    "apiVersion": "leasebox.dev/v1alpha1",
    "kind": "OutboxWorkerPool",
    "metadata": {"name": NAME, "namespace": "default"},
    "spec": {
        "kinds": ["otp", "verification"],
        "database": {"secretRef": {"name": "leasebox-database"}},
        "provider": {"secretRef": {"name": "leasebox-provider"}},
        "sla": {"oldestPendingAgeSeconds": 30},
        "scaling": {"minReplicas": 1, "maxReplicas": 6, "pollIntervalSeconds": 1},
    },
}


def kubectl_binary() -> str:
    found = shutil.which("kubectl")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is missing: install it (make tools)")
        pytest.skip("kubectl is missing (make tools installs it)")
    return found


class Kubectl:
    def __init__(self, kubeconfig: Path, home: Path) -> None:
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}
        self.binary = kubectl_binary()

    def __call__(self, *args: str) -> str:
        result = subprocess.run(
            [self.binary, *args], env=self.env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    def table(self, *args: str) -> list[dict[str, str]]:
        """`kubectl get` output as rows of {column: cell}, cut at the header's columns."""
        header, *lines = self("get", *args).splitlines()
        names = header.split()
        starts = [header.index(name) for name in names]
        ends = [*starts[1:], None]
        return [
            {name: line[start:end].strip() for name, start, end in zip(names, starts, ends,
                                                                      strict=True)}
            for line in lines
        ]  # fmt: skip


@pytest.fixture
def cluster(kube_emulator: KubeEmulator, db_dsn: str, tmp_path: Path) -> Iterator[Cluster]:
    with running_operator(kube_emulator, db_dsn, tmp_path):
        kube_emulator.create(*POOLS, json.loads(json.dumps(POOL)), namespace="default")
        cluster = Cluster(kube_emulator, NAME)
        wait_for(lambda: cluster.condition_is("Ready", "True"), what="Ready=True",
                 timeout=OPERATOR_START_SECONDS)  # fmt: skip
        wait_for(lambda: cluster.status().get("backlog"), what="a first backlog poll")
        yield cluster


@pytest.fixture
def kubectl(kube_emulator: KubeEmulator, tmp_path: Path) -> Kubectl:
    return Kubectl(kube_emulator.write_kubeconfig(tmp_path / "kubectl-config"), tmp_path)


def test_kubectl_get_shows_the_summary_columns(cluster: Cluster, kubectl: Kubectl) -> None:
    (row,) = kubectl.table("owp")
    assert list(row) == ["NAME", "KINDS", "READY", "REPLICAS", "PENDING", "OLDEST", "SLA", "AGE"]
    assert row["NAME"] == NAME
    assert row["KINDS"] == "otp, verification"
    assert (row["READY"], row["REPLICAS"], row["PENDING"]) == ("True", "1", "0")
    assert (row["OLDEST"], row["SLA"]) == ("0", "30")
    assert row["AGE"].endswith("s")


def test_kubectl_get_wide_adds_desired_dead_mode_and_the_ready_message(
    cluster: Cluster, kubectl: Kubectl
) -> None:
    (row,) = kubectl.table("outboxworkerpools", "-o", "wide")
    assert list(row) == ["NAME", "KINDS", "READY", "REPLICAS", "DESIRED", "PENDING", "OLDEST",
                         "SLA", "DEAD", "MODE", "PAUSED", "STATUS", "AGE"]  # fmt: skip
    assert (row["DESIRED"], row["DEAD"], row["MODE"]) == ("1", "0", "Operator")
    assert row["PAUSED"] == "false"
    assert row["STATUS"] == "1 of 1 workers available"


def test_kubectl_scale_sizes_a_pool_in_mode_external(cluster: Cluster, kubectl: Kubectl) -> None:
    cluster.patch_spec({"scaling": {"mode": "External"}})
    assert kubectl("scale", "owp", NAME, "--replicas=4").strip() == (
        f"outboxworkerpool.leasebox.dev/{NAME} scaled"
    )
    wait_for(lambda: cluster.replicas() == 4, what="the workers to follow spec.replicas")
    wait_for(lambda: cluster.status().get("replicas") == 4, what="status.replicas")
    path = f"/apis/leasebox.dev/v1alpha1/namespaces/default/outboxworkerpools/{NAME}/scale"
    scale = json.loads(kubectl("get", "--raw", path))
    assert scale["spec"]["replicas"] == 4
    assert scale["status"]["replicas"] == 4
    assert scale["status"]["selector"] == (
        f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name=leasebox-worker"
    )
    kubectl("scale", "owp", NAME, "--replicas=50")
    wait_for(lambda: cluster.condition_is("ScalingLimited", "True", "LimitReached"),
             what="ScalingLimited at maxReplicas")  # fmt: skip
    assert cluster.replicas() == 6
