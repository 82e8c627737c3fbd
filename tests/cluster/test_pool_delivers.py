"""A pool on the real control plane, from `kubectl apply` to mail in the SMTP sink.

The chart's operator (a pod, running as the chart's ServiceAccount) creates the worker
Deployment; the controller-manager makes its ReplicaSet and pods; the test node runs the
`migrate` init container and `leasebox worker` from the pod spec the server stored, with
the DSN and the provider URL from the pool's Secrets. Messages enqueued in PostgreSQL reach
the sink; the status reports the backlog and the rates; `kubectl get owp` prints the
columns the real server computes from the CRD; `kubectl scale` and an HPA size a pool in
mode External through its scale subresource; a pod deleted mid-send loses nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from leasebox import OutboxMessage, enqueue
from leasebox.db.migrations import expected_schema_version
from leasebox.testing.smtp_sink import SmtpSink
from support.cluster.controlplane import ControlPlane
from support.cluster.release import POOLS, Pool, secret
from support.cluster.rest import Rest
from support.pace import wait_for

NAME = "otp"
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "identity"}, "annotations": {"mesh.example/inject": "true"}},
    "spec": {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "mail", "effect": "NoSchedule"}
        ],
        "imagePullSecrets": [{"name": "registry"}],
    },
}


def pool_manifest(namespace: str, **sections: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kinds": ["otp", "verification"],
        "database": {"secretRef": {"name": "leasebox-database"}},
        "provider": {"secretRef": {"name": "leasebox-provider"}},
        "sla": {"oldestPendingAgeSeconds": 30},
        "scaling": {
            "minReplicas": 1,
            "maxReplicas": 3,
            "pollIntervalSeconds": 1,
            "scaleDownStabilizationSeconds": 2,
        },
        "worker": {
            "concurrency": 4,
            "podTemplate": TEMPLATE,
            "env": [{"name": "LEASEBOX_POLL_INTERVAL", "value": "0.2"}],
        },
    }
    for key, value in sections.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "leasebox.dev/v1alpha1",
        "kind": "OutboxWorkerPool",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    with SmtpSink() as running:
        yield running


def _enqueue(dsn: str, count: int, prefix: str = "user") -> None:
    with psycopg.connect(dsn) as conn:
        for n in range(count):
            enqueue(
                conn,
                OutboxMessage(
                    kind="otp",
                    recipient=f"{prefix}{n}@example.com",
                    aggregate_id=f"{prefix}-{n}",
                    data={"code": f"{n:06d}", "minutes_valid": 10},
                ),
            )
        conn.commit()


def _apply_pool(
    plane: ControlPlane, kube: Rest, namespace: str, dsn: str, sink: SmtpSink, **sections: Any
) -> Pool:
    kube.create("v1", "secrets", secret("leasebox-database", "dsn", dsn, namespace), namespace)
    kube.create("v1", "secrets", secret("leasebox-provider", "url", sink.url, namespace), namespace)
    manifest = json.dumps(pool_manifest(namespace, **sections))
    plane.kubectl("apply", "--server-side", "-f", "-", stdin=manifest)
    return Pool(kube, NAME, namespace)


def test_an_applied_pool_migrates_runs_its_workers_and_delivers(
    release: str,
    control_plane: ControlPlane,
    kube: Rest,
    namespace: str,
    empty_db_dsn: str,
    sink: SmtpSink,
) -> None:
    del release
    pool = _apply_pool(control_plane, kube, namespace, empty_db_dsn, sink)
    wait_for(lambda: pool.ready_pods() >= 1, what="a ready worker pod", timeout=120)
    pool.wait_condition("Ready", "True", "Available")
    with psycopg.connect(empty_db_dsn) as conn:
        applied = conn.execute("SELECT max(version) FROM leasebox.schema_migrations").fetchone()
    assert applied == (expected_schema_version(),)
    # The operator announces the schema only when a poll saw it missing; the workers' init
    # container may migrate it before the pool's first poll (which waits a random part of its
    # interval). tests/cluster/test_operator_scaling.py waits for both Events.
    if "SchemaMissing" in pool.event_reasons():
        wait_for(lambda: "SchemaReady" in pool.event_reasons(), what="the SchemaReady Event")

    deployment = pool.deployment() or {}
    template = deployment["spec"]["template"]
    for field, value in TEMPLATE["spec"].items():
        assert template["spec"][field] == value, field
    assert template["metadata"]["labels"]["team"] == "identity"
    (pod,) = kube.list("v1", "pods", namespace)
    assert pod["metadata"]["labels"]["team"] == "identity"
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0

    _enqueue(empty_db_dsn, 20)
    wait_for(lambda: len(sink.received) == 20, what="20 messages in the sink", timeout=60)
    assert {m.recipient for m in sink.received} == {f"user{n}@example.com" for n in range(20)}

    # The pool reported rates before the messages were enqueued; a poll after the last send
    # reports an empty backlog.
    status = wait_for(
        lambda: (s := pool.status()).get("rates") and s["backlog"]["pending"] == 0 and s,
        what="rates and an empty backlog in the status",
    )
    assert (status["replicas"], status["readyReplicas"]) == (1, 1)
    (row,) = control_plane.table("owp", "-n", namespace)
    assert list(row) == ["NAME", "KINDS", "READY", "REPLICAS", "PENDING", "OLDEST", "SLA", "AGE"]
    assert (row["NAME"], row["KINDS"], row["READY"], row["REPLICAS"]) == (
        NAME,
        "otp, verification",
        "True",
        "1",
    )
    assert (row["PENDING"], row["SLA"]) == ("0", "30")
    (wide,) = control_plane.table("outboxworkerpools", "-n", namespace, "-o", "wide")
    assert list(wide) == [
        "NAME",
        "KINDS",
        "READY",
        "REPLICAS",
        "DESIRED",
        "PENDING",
        "OLDEST",
        "SLA",
        "DEAD",
        "MODE",
        "PAUSED",
        "STATUS",
        "AGE",
    ]
    assert (wide["DESIRED"], wide["DEAD"], wide["MODE"]) == ("1", "0", "Operator")
    assert wide["PAUSED"] == "false"
    assert wide["STATUS"] == "1 of 1 workers available"

    # Drift made by hand is put back on the next resync.
    image = template["spec"]["containers"][0]["image"]
    control_plane.kubectl(
        "set", "image", f"deployment/{pool.deployment_name}", "worker=evil:1", "-n", namespace
    )
    wait_for(
        lambda: (
            (pool.deployment() or {})["spec"]["template"]["spec"]["containers"][0]["image"] == image
        ),
        what="the operator to put the image back",
        timeout=30,
    )

    # Deleted: the garbage collector takes the children, the node stops the pods.
    kube.delete(*POOLS, NAME, namespace)
    wait_for(lambda: pool.get() is None, what="the pool to be deleted", timeout=60)
    wait_for(lambda: pool.deployment() is None, what="the Deployment to be collected", timeout=60)
    wait_for(
        lambda: (
            kube.get("policy/v1", "poddisruptionbudgets", pool.deployment_name, namespace) is None
        ),
        what="the PDB to be collected",
    )
    wait_for(lambda: not kube.list("v1", "pods", namespace), what="the pods to go", timeout=90)


def test_kubectl_scale_and_an_hpa_size_a_pool_in_mode_external(
    release: str,
    control_plane: ControlPlane,
    kube: Rest,
    namespace: str,
    db_dsn: str,
    sink: SmtpSink,
) -> None:
    del release
    pool = _apply_pool(
        control_plane, kube, namespace, db_dsn, sink, scaling={"mode": "External", "maxReplicas": 6}
    )
    wait_for(pool.deployment, what="the worker Deployment", timeout=60)
    done = control_plane.kubectl("scale", "owp", NAME, "--replicas=2", "-n", namespace)
    assert done.stdout.strip() == f"outboxworkerpool.leasebox.dev/{NAME} scaled"
    wait_for(lambda: pool.ready_pods() == 2, what="two ready workers", timeout=120)
    wait_for(lambda: pool.status().get("replicas") == 2, what="status.replicas")
    path = f"/apis/leasebox.dev/v1alpha1/namespaces/{namespace}/outboxworkerpools/{NAME}/scale"
    scale = json.loads(control_plane.kubectl("get", "--raw", path).stdout)
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (2, 2)
    assert scale["status"]["selector"] == (
        f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name=leasebox-worker"
    )

    # An HPA drives the same subresource: its controller holds replicas within its bounds.
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "leasebox.dev/v1alpha1",
                "kind": "OutboxWorkerPool",
                "name": NAME,
            },
            "minReplicas": 3,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 80},
                    },
                }
            ],
        },
    }
    kube.create("autoscaling/v2", "horizontalpodautoscalers", hpa, namespace)
    wait_for(lambda: pool.replicas() == 3, what="the HPA's minimum on the workers", timeout=60)
    assert (pool.get() or {})["spec"]["replicas"] == 3
    kube.delete("autoscaling/v2", "horizontalpodautoscalers", NAME, namespace)

    control_plane.kubectl("scale", "owp", NAME, "--replicas=50", "-n", namespace)
    pool.wait_condition("ScalingLimited", "True", "LimitReached")
    assert pool.replicas() == 6


def test_a_worker_pod_deleted_mid_send_loses_nothing(
    release: str,
    control_plane: ControlPlane,
    kube: Rest,
    namespace: str,
    db_dsn: str,
) -> None:
    del release
    with SmtpSink(delay_seconds=0.2) as slow:
        pool = _apply_pool(
            control_plane, kube, namespace, db_dsn, slow, scaling={"mode": "External"}
        )
        control_plane.kubectl("scale", "owp", NAME, "--replicas=2", "-n", namespace)
        wait_for(lambda: pool.ready_pods() == 2, what="two ready workers", timeout=120)
        _enqueue(db_dsn, 80)
        wait_for(lambda: len(slow.received) >= 10, what="sends under way", timeout=60)
        victim = kube.list("v1", "pods", namespace)[0]["metadata"]["name"]
        control_plane.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
        wait_for(
            lambda: len({m.delivery_key for m in slow.received}) == 80,
            what="every message delivered",
            timeout=120,
        )
        wait_for(lambda: pool.ready_pods() == 2, what="the replacement pod", timeout=120)
        wait_for(lambda: _unsettled(db_dsn) == 0, what="every message settled", timeout=120)
        copies = len(slow.received)
    assert copies - 80 <= 4, f"{copies - 80} duplicates: more than the deleted pod's 4 slots"


def _unsettled(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM leasebox.queue").fetchone()
    return int(row[0]) if row else 0
