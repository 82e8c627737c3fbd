"""The control plane fails under a running operator: its API server and etcd restart, and
another field manager takes a field of a child.

Each fault is the real program's own: the API server is killed in the middle of the
operator's reconcile of a new pool (right after the server logged the operator's create of
the Deployment, before the rest of the children and the status) and started again on the
same port and data; etcd is killed and started again under a running pool. Afterwards the
operator must have finished what it was doing (every child once, the status complete) and
must still act on changes (its watch resumed). A server-side-apply conflict with another
*applier* is reported in the pool's status and Events and left alone, not fought over on
every resync; once that manager applies the operator's value, the pool is Ready again.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from support.cluster.controlplane import ControlPlane
from support.cluster.release import POOLS, Pool, pool_body, secret
from support.cluster.rest import Rest
from support.pace import wait_for

NAME = "faults"
OPERATOR = "system:serviceaccount:leasebox-system:leasebox"
WORKER_IMAGE = '.spec.template.spec.containers[name="worker"].image'


def pool_manifest(namespace: str) -> dict[str, Any]:
    scaling = {"minReplicas": 1, "maxReplicas": 4, "pollIntervalSeconds": 1}
    return pool_body(NAME, namespace, scaling=scaling, pending=False)


@pytest.fixture
def pool(release: str, kube: Rest, namespace: str, db_dsn: str) -> Pool:
    del release
    kube.create("v1", "secrets", secret("leasebox-database", "dsn", db_dsn, namespace), namespace)
    kube.create("v1", "secrets", secret("leasebox-provider", "url", "log://", namespace), namespace)
    return Pool(kube, NAME, namespace)


@pytest.fixture
def restarts(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The control plane, left running after the test whatever the test stopped."""
    yield control_plane
    if not control_plane.etcd.alive():
        control_plane.start_etcd()
    if not control_plane.apiserver.alive():
        control_plane.start_apiserver()


def _operator_writes(plane: ControlPlane, namespace: str, resource: str, verb: str) -> int:
    return sum(
        1
        for e in plane.audit_entries()
        if (e.get("user") or {}).get("username") == OPERATOR
        and e.get("verb") == verb
        and e.get("stage") == "ResponseComplete"
        and (e.get("objectRef") or {}).get("namespace") == namespace
        and (e.get("objectRef") or {}).get("resource") == resource
    )


def _children(kube: Rest, namespace: str) -> list[tuple[str, str]]:
    found = [
        *(
            ("Deployment", d["metadata"]["name"])
            for d in kube.list("apps/v1", "deployments", namespace)
        ),
        *(
            ("PodDisruptionBudget", p["metadata"]["name"])
            for p in kube.list("policy/v1", "poddisruptionbudgets", namespace)
        ),
    ]
    return sorted(found)


def test_the_operator_finishes_a_reconcile_cut_by_an_api_server_restart_and_watches_on(
    restarts: ControlPlane, kube: Rest, namespace: str, pool: Pool
) -> None:
    plane = restarts
    kube.create(*POOLS, pool_manifest(namespace), namespace)
    wait_for(
        lambda: _operator_writes(plane, namespace, "deployments", "create") > 0,
        what="the operator's create of the Deployment",
        timeout=60,
    )
    plane.apiserver.stop(signal.SIGKILL)
    plane.start_apiserver()

    pool.wait_condition("Ready", "True", timeout=90)
    assert _children(kube, namespace) == [
        ("Deployment", f"{NAME}-worker"),
        ("PodDisruptionBudget", f"{NAME}-worker"),
    ]
    status = pool.status()
    assert status["observedGeneration"] == (pool.get() or {})["metadata"]["generation"]
    assert status["selector"]
    wait_for(lambda: "backlog" in pool.status(), what="the backlog in the status", timeout=60)

    # The watch resumed: a change made after the restart is acted on.
    pool.patch_spec({"scaling": {"minReplicas": 3}})
    wait_for(lambda: pool.replicas() == 3, what="minReplicas applied after the restart", timeout=60)
    assert {"Ready", "DatabaseReachable"} <= {c["type"] for c in pool.status()["conditions"]}


def test_the_operator_carries_on_after_etcd_restarts(
    restarts: ControlPlane, kube: Rest, namespace: str, pool: Pool
) -> None:
    plane = restarts
    kube.create(*POOLS, pool_manifest(namespace), namespace)
    pool.wait_condition("Ready", "True", timeout=90)
    plane.etcd.stop(signal.SIGKILL)
    plane.start_etcd()
    wait_for(plane.ready, what="the API server to be ready again", timeout=60)

    pool.patch_spec({"scaling": {"minReplicas": 2}})
    wait_for(
        lambda: pool.replicas() == 2, what="a change acted on after etcd came back", timeout=90
    )
    pool.wait_condition("Ready", "True", timeout=60)
    assert _children(kube, namespace) == [
        ("Deployment", f"{NAME}-worker"),
        ("PodDisruptionBudget", f"{NAME}-worker"),
    ]


def _apply_as(plane: ControlPlane, manager: str, manifest: dict[str, Any]) -> None:
    plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={manager}",
        "-f",
        "-",
        stdin=json.dumps(manifest),
    )


def _image(pool: Pool) -> str:
    deployment = pool.deployment() or {}
    (worker,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "worker"
    ]
    return str(worker["image"])


def test_a_field_another_manager_applies_is_reported_and_not_fought_over(
    control_plane: ControlPlane, kube: Rest, namespace: str, pool: Pool
) -> None:
    kube.create(*POOLS, pool_manifest(namespace), namespace)
    pool.wait_condition("Ready", "True", timeout=90)
    ours = _image(pool)
    claim = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": pool.deployment_name, "namespace": namespace},
        "spec": {
            "selector": (pool.deployment() or {})["spec"]["selector"],
            "template": {"spec": {"containers": [{"name": "worker", "image": "example/other:1"}]}},
        },
    }
    _apply_as(control_plane, "gitops", claim)

    pool.wait_condition("Ready", "False", "FieldConflict", timeout=60)
    ready = pool.condition("Ready") or {}
    assert "gitops" in ready["message"]
    assert "image" in ready["message"]
    wait_for(lambda: "FieldConflict" in pool.event_reasons(), what="the FieldConflict Event")
    # Not fought: the operator tries again on its resyncs and forces nothing.
    tries = _operator_writes(control_plane, namespace, "deployments", "patch")
    wait_for(
        lambda: _operator_writes(control_plane, namespace, "deployments", "patch") >= tries + 2,
        what="two more applies by the operator",
        timeout=60,
    )
    assert _image(pool) == "example/other:1"
    assert pool.event_reasons().count("FieldConflict") == 1

    # The other manager comes to apply the operator's value: they share the field, and the
    # operator's next apply goes through.
    agreed = json.loads(json.dumps(claim))
    agreed["spec"]["template"]["spec"]["containers"][0]["image"] = ours
    _apply_as(control_plane, "gitops", agreed)
    pool.wait_condition("Ready", "True", timeout=60)
    assert _image(pool) == ours
