"""The chart's RBAC, enforced by the real server: every rule needed, none dead.

The operator runs as the chart's ServiceAccount, so the API server checks each of its
requests against the chart's ClusterRole; the server's audit log records every request of
a ServiceAccount with the decision. The test drives a pool through everything the
operator does (children, monitoring objects created and deleted, scaling through the scale
subresource, status, Events, Secrets), then reads the log: no request of the operator was
refused, and every verb of every rule of the ClusterRole granted at least one request that
no other rule grants. Removing any one rule or verb would therefore refuse a request the
operator made while doing its work, which the test above would have seen fail.

The Prometheus Operator's CRDs are installed as schema-less stand-ins (its objects' content
is not what is checked here, only that the operator may write them).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from support.cluster.controlplane import ControlPlane
from support.cluster.release import POOLS, Pool, secret
from support.cluster.rest import Rest
from support.outbox_rows import insert_backlog
from support.pace import wait_for

ACCOUNT = "system:serviceaccount:leasebox-system:leasebox"


def _stand_in_crd(plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def _grants(rule: dict[str, Any], entry: dict[str, Any]) -> bool:
    ref = entry.get("objectRef") or {}
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    names = rule.get("resourceNames")
    return (
        ref.get("apiGroup", "") in rule["apiGroups"]
        and resource in rule["resources"]
        and entry["verb"] in rule["verbs"]
        and (not names or ref.get("name") in names)
    )


def test_the_operator_needs_every_rule_of_its_cluster_role_and_is_refused_nothing(
    release: str, control_plane: ControlPlane, kube: Rest, namespace: str, db_dsn: str
) -> None:
    del release
    for plural, kind in (("podmonitors", "PodMonitor"), ("prometheusrules", "PrometheusRule")):
        if (
            kube.get(
                "apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                f"{plural}.monitoring.coreos.com",
            )
            is None
        ):
            kube.create(
                "apiextensions.k8s.io/v1", "customresourcedefinitions", _stand_in_crd(plural, kind)
            )
    kube.create("v1", "secrets", secret("leasebox-database", "dsn", db_dsn, namespace), namespace)
    kube.create("v1", "secrets", secret("leasebox-provider", "url", "log://", namespace), namespace)
    manifest = {
        "apiVersion": "leasebox.dev/v1alpha1",
        "kind": "OutboxWorkerPool",
        "metadata": {"name": "rbac", "namespace": namespace},
        "spec": {
            "kinds": ["otp"],
            "database": {"secretRef": {"name": "leasebox-database"}},
            "provider": {"secretRef": {"name": "leasebox-provider"}},
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": 4,
                "pollIntervalSeconds": 1,
                "initialWorkerThroughput": 1,
                "startupSeconds": 1,
            },
            "monitoring": {"podMonitor": True, "prometheusRule": True},
            "worker": {"podTemplate": {"spec": {"nodeSelector": {"leasebox.dev/node": "none"}}}},
        },
    }
    control_plane.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(manifest))
    pool = Pool(kube, "rbac", namespace)
    wait_for(
        lambda: kube.get("monitoring.coreos.com/v1", "prometheusrules", "rbac-worker", namespace),
        what="the PrometheusRule",
        timeout=60,
    )
    with psycopg.connect(db_dsn) as conn:
        insert_backlog(conn, 500, prefix="rbac")
    wait_for(lambda: (pool.replicas() or 0) > 1, what="a scale-up", timeout=60)
    # A resync applies the existing monitoring objects again (a patch, not a create).
    wait_for(
        lambda: any(
            e["verb"] == "patch" and (e.get("objectRef") or {}).get("resource") == "podmonitors"
            for e in control_plane.audit_entries()
        ),
        what="a resync of the monitoring objects",
        timeout=60,
    )
    pool.patch_spec({"monitoring": {"podMonitor": False, "prometheusRule": False}})
    wait_for(
        lambda: (
            kube.get("monitoring.coreos.com/v1", "podmonitors", "rbac-worker", namespace) is None
        ),
        what="the PodMonitor deleted",
        timeout=60,
    )
    kube.delete(*POOLS, "rbac", namespace)
    wait_for(lambda: pool.get() is None, what="the pool deleted", timeout=60)

    entries = [
        e for e in control_plane.audit_entries() if (e.get("user") or {}).get("username") == ACCOUNT
    ]
    assert entries, "the operator made no request as its ServiceAccount"
    refused = sorted(
        {
            f"{e['verb']} {(e.get('objectRef') or {}).get('resource')}"
            f"/{(e.get('objectRef') or {}).get('subresource', '')}"
            for e in entries
            if (e.get("annotations") or {}).get("authorization.k8s.io/decision") != "allow"
            and (e.get("responseStatus") or {}).get("code") == 403
            and not control_plane.while_warming(e)
        }
    )
    assert refused == [], f"the chart's RBAC refused the operator: {refused}"

    role = kube.get("rbac.authorization.k8s.io/v1", "clusterroles", "leasebox")
    assert role is not None
    rules: list[dict[str, Any]] = role["rules"]
    dead = []
    for index, rule in enumerate(rules):
        others = [r for i, r in enumerate(rules) if i != index]
        for verb in rule["verbs"]:
            single = {**rule, "verbs": [verb]}
            needed = [
                e for e in entries if _grants(single, e) and not any(_grants(o, e) for o in others)
            ]
            if not needed:
                dead.append(
                    f"{verb} {','.join(rule['apiGroups']) or 'core'}/{','.join(rule['resources'])}"
                )
    assert dead == [], f"rules no request of the operator needed: {dead}"
