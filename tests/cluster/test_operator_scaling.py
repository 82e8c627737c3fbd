"""The operator's decisions on the real control plane: scale, report, hold, refuse, clean up.

One pool goes through its life with the chart's operator: applied (children and status
appear), a backlog arrives (replicas go up), the backlog drains (replicas come down after
the stabilisation window), the database goes away (replicas kept, condition false) and
comes back, the pool is paused (its workers go to zero and stay there), its spec turns
invalid (a condition), and it is deleted (its children go). The pool's pods select a node
that does not exist, so they stay Pending as on a full cluster and nothing drains the
backlog but the test: the decisions are the operator's alone. "Nothing changed" is checked
after the operator's poll counters show that it looked, never after a sleep.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql

from leasebox.db.migrations import migrate
from support.cluster.kubelet import ProcessKubelet
from support.cluster.release import (
    POOLS,
    Pool,
    operator_log,
    operator_metrics,
    pool_body,
    sample,
    secret,
)
from support.cluster.rest import ApiError, Rest
from support.outbox_rows import insert_backlog
from support.pace import wait_for

RELEASE = "leasebox"
NAME = "e2e"
POLLS = "leasebox_operator_poll_duration_seconds_count"


def pool_manifest(namespace: str) -> dict[str, Any]:
    scaling = {
        "minReplicas": 1,
        "maxReplicas": 8,
        "pollIntervalSeconds": 1,
        "scaleDownStabilizationSeconds": 2,
        "initialWorkerThroughput": 10,
        "startupSeconds": 1,
    }
    return pool_body(NAME, namespace, scaling=scaling, sla={"oldestPendingAgeSeconds": 30})


class Database:
    """The pool's outbox database, with a switch that takes it away."""

    def __init__(self, dsn: str, server_dsn: str) -> None:
        self.dsn = dsn
        self.server_dsn = server_dsn
        self.name = str(conninfo.conninfo_to_dict(dsn)["dbname"])

    def insert_backlog(self, count: int) -> None:
        with psycopg.connect(self.dsn) as conn:
            insert_backlog(conn, count, prefix="e2e")

    def drain(self) -> None:
        with psycopg.connect(self.dsn) as conn:
            conn.execute("DELETE FROM leasebox.queue")  # as if every message had been sent

    def allow_connections(self, allowed: bool) -> None:
        with psycopg.connect(self.server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                    sql.Identifier(self.name), sql.SQL("true" if allowed else "false")
                )
            )
            if not allowed:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.name,),
                )


@pytest.fixture
def database(db_dsn: str, server_dsn: str) -> Iterator[Database]:
    db = Database(db_dsn, server_dsn)
    yield db
    db.allow_connections(True)


def test_the_operator_scales_reports_holds_refuses_and_cleans_up_a_pool(
    release: str, kube: Rest, kubelet: ProcessKubelet, namespace: str, database: Database
) -> None:
    def metric(name: str) -> float:
        return sample(operator_metrics(kube, kubelet, release, RELEASE), name)

    failed_polls = f'leasebox_operator_poll_errors_total{{namespace="{namespace}",pool="{NAME}"}}'
    kube.create(
        "v1", "secrets", secret("leasebox-database", "dsn", database.dsn, namespace), namespace
    )
    kube.create("v1", "secrets", secret("leasebox-provider", "url", "log://", namespace), namespace)
    kube.create(*POOLS, pool_manifest(namespace), namespace)
    pool = Pool(kube, NAME, namespace)

    # Applied: the Deployment, the PDB and the status appear.
    deployment = wait_for(pool.deployment, what="the worker Deployment", timeout=60)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "OutboxWorkerPool"
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert next(v for v in env if v["name"] == "LEASEBOX_DSN") == {
        "name": "LEASEBOX_DSN",
        "valueFrom": {"secretKeyRef": {"name": "leasebox-database", "key": "dsn"}},
    }
    wait_for(
        lambda: kube.get("policy/v1", "poddisruptionbudgets", pool.deployment_name, namespace),
        what="the PodDisruptionBudget",
    )
    pool.wait_condition("DatabaseReachable", "True")

    # A backlog arrives: replicas go up within a few polls (counted, not timed).
    polls = metric(POLLS)
    database.insert_backlog(600)
    at_scale_up = wait_for(
        lambda: metric(POLLS) if (pool.replicas() or 0) > 1 else None, what="a scale-up", timeout=60
    )
    assert at_scale_up - polls <= 4
    wait_for(
        lambda: pool.status().get("backlog", {}).get("pending") == 600,
        what="the backlog in the status",
    )
    scaled_up = wait_for(
        lambda: next((e for e in pool.events() if e["reason"] == "ScaledUp"), None),
        what="the ScaledUp Event",
    )
    assert scaled_up["message"].startswith("scale up 1→")
    assert "backlog 600" in scaled_up["message"]
    assert "SLA" in scaled_up["message"]
    page = operator_metrics(kube, kubelet, release, RELEASE)
    labels = f'namespace="{namespace}",pool="{NAME}"'
    assert f'leasebox_pool_messages{{{labels},state="pending"}} 600.0' in page
    assert f"leasebox_pool_sla_seconds{{{labels}}} 30.0" in page

    # Drained: replicas come down to minReplicas once the stabilisation window has passed.
    database.drain()
    wait_for(lambda: pool.replicas() == 1, what="the scale-down to minReplicas", timeout=60)
    wait_for(lambda: "ScaledDown" in pool.event_reasons(), what="the ScaledDown Event")
    wait_for(
        lambda: pool.status().get("lastScaleReason", "").startswith("scale down"),
        what="the scale-down reason in the status",
    )

    # The database goes away: replicas kept, DatabaseReachable=False, an Event; then back.
    database.insert_backlog(50)
    wait_for(lambda: pool.status().get("backlog", {}).get("pending") == 50, what="new backlog")
    before = pool.replicas()
    database.allow_connections(False)
    pool.wait_condition("DatabaseReachable", "False", "ConnectionFailed")
    failed = metric(failed_polls)
    wait_for(lambda: metric(failed_polls) >= failed + 3, what="three more failed polls", timeout=60)
    assert pool.replicas() == before
    wait_for(lambda: "DatabaseUnreachable" in pool.event_reasons(), what="the outage Event")
    assert database.dsn not in json.dumps(pool.status())
    database.allow_connections(True)
    pool.wait_condition("DatabaseReachable", "True")

    # Paused: the workers go to zero; a new backlog changes nothing but the report.
    pool.patch_spec({"paused": True})
    pool.wait_condition("Paused", "True")
    wait_for(lambda: pool.replicas() == 0, what="the paused pool at zero")
    database.insert_backlog(2000)
    wait_for(
        lambda: pool.status().get("backlog", {}).get("pending") == 2050,
        what="the paused pool's backlog",
    )
    seen = metric(POLLS)
    wait_for(lambda: metric(POLLS) >= seen + 3, what="three more polls", timeout=60)
    assert pool.replicas() == 0
    assert pool.status()["desiredReplicas"] == 0

    # An invalid spec never reaches the operator: the server refuses it with the rule's
    # message (the operator's own refusal, for objects stored before a stricter CRD, is
    # tested beside its reconcile logic).
    with pytest.raises(ApiError) as refused:
        pool.patch_spec({"scaling": {"minReplicas": 9}})
    assert refused.value.status == 422
    assert "minReplicas must not exceed maxReplicas" in str(refused.value)
    assert pool.replicas() == 0
    assert {e.get("reportingComponent") for e in pool.events()} == {"leasebox-operator"}

    # Deleted: the children go with it.
    kube.delete(*POOLS, NAME, namespace)
    wait_for(lambda: pool.get() is None, what="the pool to be gone", timeout=60)
    wait_for(lambda: pool.deployment() is None, what="the Deployment to be collected", timeout=60)

    # The operator's log: one JSON object per line, and never the database's DSN.
    log = operator_log(kubelet, release)
    assert log.strip()
    for line in log.splitlines():
        assert {"time", "level", "logger", "message"} <= set(json.loads(line)), line
    assert database.dsn not in log


def test_a_pool_on_an_empty_database_says_who_migrates_it_and_sees_the_schema_arrive(
    release: str, kube: Rest, namespace: str, empty_db_dsn: str
) -> None:
    del release
    kube.create(
        "v1", "secrets", secret("leasebox-database", "dsn", empty_db_dsn, namespace), namespace
    )
    kube.create("v1", "secrets", secret("leasebox-provider", "url", "log://", namespace), namespace)
    kube.create(*POOLS, pool_manifest(namespace), namespace)
    pool = Pool(kube, NAME, namespace)

    # Its pods stay Pending, so nothing but the test migrates the database.
    pool.wait_condition("Ready", "False", "SchemaMissing", timeout=60)
    assert "init container" in (pool.condition("Ready") or {})["message"]
    wait_for(lambda: "SchemaMissing" in pool.event_reasons(), what="the SchemaMissing Event")

    migrate(empty_db_dsn)
    wait_for(lambda: "SchemaReady" in pool.event_reasons(), what="the SchemaReady Event")
    ready = wait_for(
        lambda: (c := pool.condition("Ready")) and c["reason"] != "SchemaMissing" and c,
        what="Ready to move past SchemaMissing",
    )
    assert ready["status"] == "False"  # the workers, still Pending, are what it waits for
    assert pool.event_reasons().count("SchemaMissing") == 1


def test_a_pool_whose_secret_is_missing_says_so_and_recovers_when_it_appears(
    release: str, kube: Rest, namespace: str, db_dsn: str
) -> None:
    del release
    kube.create("v1", "secrets", secret("leasebox-provider", "url", "log://", namespace), namespace)
    manifest = pool_manifest(namespace)
    del manifest["spec"]["worker"]  # schedulable: its workers run once it can be made
    manifest["spec"]["database"] = {"secretRef": {"name": "late-database"}}
    kube.create(*POOLS, manifest, namespace)
    pool = Pool(kube, NAME, namespace)

    pool.wait_condition("Ready", "False", "SecretNotFound", timeout=60)
    message = (pool.condition("Ready") or {})["message"]
    assert f"Secret {namespace}/late-database does not exist" in message
    wait_for(lambda: "SecretNotFound" in pool.event_reasons(), what="the SecretNotFound Event")
    assert pool.event_reasons().count("SecretNotFound") == 1
    assert pool.deployment() is None  # nothing half-made

    kube.create("v1", "secrets", secret("late-database", "dsn", db_dsn, namespace), namespace)
    wait_for(pool.deployment, what="the Deployment once the Secret exists", timeout=60)
    pool.wait_condition("Ready", "True", "Available", timeout=120)
