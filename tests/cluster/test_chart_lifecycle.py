"""The chart's life on a cluster of its own: upgrade, high availability, test, uninstall.

A control plane of its own (seconds to start), so that this release owns the CRD and no
other test's pools are in the way. The starting point is the chart as it was before any
test ran it on a real server (`BASELINE`, read from git). That chart's CRD is one the real
server refuses (a section default its CEL rule cannot evaluate), so, as a team that manages
CRDs apart from the chart does, the CRD is applied first and both charts run with
`crds.install=false`. With a pool sending, `helm upgrade` to this chart rolls the operator
and the workers and loses nothing; two operator replicas with peering work one at a time
and the standby takes over when the leader's pod is deleted; `helm test` passes; `helm
uninstall` keeps the CRD and the pools.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from leasebox import OutboxMessage, enqueue
from leasebox.testing.smtp_sink import SmtpSink
from support.chart import render
from support.cluster.controlplane import ROOT, ControlPlane, start_control_plane
from support.cluster.kubelet import ProcessKubelet, cleanup
from support.cluster.release import (
    CHART,
    OPERATOR_START_SECONDS,
    POOLS,
    Pool,
    helm_client,
    operator_values,
    running_operator_pods,
    secret,
)
from support.cluster.rest import Rest
from support.pace import wait_for

# The chart as of the first real-server tests: the upgrade path users are on.
BASELINE = "505acb5"
SYSTEM = "leasebox-system"
RELEASE = "lifecycle"
APPS = "apps"


@pytest.fixture
def fresh(
    tmp_path: Path, control_plane: ControlPlane
) -> Iterator[tuple[ControlPlane, ProcessKubelet, Rest]]:
    """A second control plane and node, for this test alone."""
    folder = control_plane.folder.parent / f"{control_plane.folder.name}-lifecycle"
    cleanup(folder)
    plane = start_control_plane(folder)
    node = ProcessKubelet(plane, folder / "node").start()
    pki = plane.pki
    try:
        yield plane, node, Rest(plane.url, pki.ca, cert=(pki.admin.cert, pki.admin.key))
    finally:
        node.stop()
        plane.stop()  # the folder stays until the next run, for its logs


def baseline_chart(folder: Path) -> Path:
    archive = folder / "baseline.tar"
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), BASELINE, "charts/leasebox"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"the baseline chart {BASELINE} is not in git: {done.stderr}"
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return folder / "charts" / "leasebox"


def _enqueue(dsn: str, start: int, count: int) -> None:
    with psycopg.connect(dsn) as conn:
        for n in range(start, start + count):
            enqueue(
                conn,
                OutboxMessage(
                    kind="otp",
                    recipient=f"u{n}@example.com",
                    aggregate_id=f"u-{n}",
                    data={"code": f"{n:06d}", "minutes_valid": 10},
                ),
            )
        conn.commit()


def _scale_writers(plane: ControlPlane, namespace: str, deployment: str) -> list[str]:
    """The user-agent of every write to the workers' scale subresource, oldest first."""
    return [
        str(entry.get("userAgent", ""))
        for entry in plane.audit_entries()
        if entry.get("verb") == "patch"
        and (ref := entry.get("objectRef"))
        and isinstance(ref, dict)
        and ref.get("resource") == "deployments"
        and ref.get("subresource") == "scale"
        and ref.get("namespace") == namespace
        and ref.get("name") == deployment
    ]


def test_upgrade_failover_test_and_uninstall_of_the_chart_with_a_pool_running(
    fresh: tuple[ControlPlane, ProcessKubelet, Rest], tmp_path: Path, db_dsn: str
) -> None:
    plane, node, kube = fresh
    crds = [
        o
        for o in render({"operator": {"peering": {"enabled": True}}})
        if o["kind"] == "CustomResourceDefinition"
    ]
    assert len(crds) == 3  # OutboxWorkerPool, ClusterKopfPeering, KopfPeering
    plane.kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}),
    )
    values = operator_values(crds={"install": False})
    with SmtpSink() as sink, helm_client(plane, SYSTEM) as helm:
        helm.install(
            str(baseline_chart(tmp_path)), RELEASE, values, create_namespace=True, timeout=120
        )
        wait_for(
            lambda: running_operator_pods(kube, node, SYSTEM, RELEASE),
            what="the baseline operator",
            timeout=OPERATOR_START_SECONDS,
        )
        kube.create(
            "v1",
            "namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APPS}},
        )
        kube.create("v1", "secrets", secret("leasebox-database", "dsn", db_dsn, APPS), APPS)
        kube.create("v1", "secrets", secret("leasebox-provider", "url", sink.url, APPS), APPS)
        pool_body = {
            "apiVersion": "leasebox.dev/v1alpha1",
            "kind": "OutboxWorkerPool",
            "metadata": {"name": "otp", "namespace": APPS},
            "spec": {
                "kinds": ["otp"],
                "database": {"secretRef": {"name": "leasebox-database"}},
                "provider": {"secretRef": {"name": "leasebox-provider"}},
                "scaling": {
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "pollIntervalSeconds": 1,
                    "initialWorkerThroughput": 1000,
                },
            },
        }
        plane.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(pool_body))
        pool = Pool(kube, "otp", APPS)
        wait_for(lambda: pool.ready_pods() == 1, what="the baseline's worker", timeout=120)
        _enqueue(db_dsn, 0, 30)
        before = (pool.deployment() or {})["metadata"]["generation"]

        # Upgrade with messages on their way: the operator rolls, nothing is lost.
        helm.upgrade(str(CHART), RELEASE, values, timeout=120)
        _enqueue(db_dsn, 30, 30)
        wait_for(
            lambda: len({m.delivery_key for m in sink.received}) == 60,
            what="every message across the upgrade",
            timeout=120,
        )
        wait_for(
            lambda: pool.condition_is("Ready", "True", "Available"),
            what="Ready after it",
            timeout=OPERATOR_START_SECONDS,
        )
        after = (pool.deployment() or {})["metadata"]["generation"]
        assert after >= before

        # Two replicas with peering: one scales, the other takes over when it goes.
        ha = operator_values(
            crds={"install": False},
            operator={"replicas": 2, "extraEnv": values["operator"]["extraEnv"]},
        )
        helm.upgrade(str(CHART), RELEASE, ha, timeout=120)
        wait_for(
            lambda: len(running_operator_pods(kube, node, SYSTEM, RELEASE)) == 2,
            what="two operator pods",
            timeout=OPERATOR_START_SECONDS,
        )
        earlier = len(_scale_writers(plane, APPS, pool.deployment_name))
        pool.patch_spec({"scaling": {"minReplicas": 2}})
        wait_for(lambda: pool.replicas() == 2, what="a scale by the leader", timeout=60)
        # Both run, one acts: every scale write since the second replica came is one pod's.
        (leader_agent,) = set(_scale_writers(plane, APPS, pool.deployment_name)[earlier:])
        leader = next(
            p for p in running_operator_pods(kube, node, SYSTEM, RELEASE) if p in leader_agent
        )
        plane.kubectl("delete", "pod", leader, "-n", SYSTEM, "--wait=false")
        wait_for(
            lambda: kube.get("v1", "pods", leader, SYSTEM) is None,
            what="the leader's pod to end",
            timeout=60,
        )
        pool.patch_spec({"scaling": {"minReplicas": 3}})
        wait_for(lambda: pool.replicas() == 3, what="a scale by the standby", timeout=90)
        last = _scale_writers(plane, APPS, pool.deployment_name)[-1]
        assert leader not in last, "the deleted leader scaled again"
        writers = {a for a in _scale_writers(plane, APPS, pool.deployment_name) if "leasebox" in a}
        assert len(writers) >= 2

        # helm test runs the chart's test pod against the operator's Service.
        helm.test(RELEASE, timeout=120)

        # Uninstall keeps the CRD and the pools.
        helm.uninstall(RELEASE, timeout=120)
        assert (
            kube.get(
                "apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                "outboxworkerpools.leasebox.dev",
            )
            is not None
        )
        assert kube.get(*POOLS, "otp", APPS) is not None
