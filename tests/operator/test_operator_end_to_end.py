"""The operator end to end: `leasebox operator` against an emulated API and a real PostgreSQL.

One pool goes through its life: applied (children and status appear), a backlog arrives
(replicas go up), the backlog drains (replicas come down after the stabilisation window),
the database goes away (replicas kept, condition false) and comes back, the pool is
paused (its workers go to zero and stay there), its spec turns invalid (a condition), and
it is deleted (its children go). Poll interval and stabilisation window are short;
"nothing changed" is checked after the operator's poll counters show that it looked, never
after a sleep.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import conninfo, sql

from support.kube.emulator import KubeEmulator
from support.kube.harness import OPERATOR_START_SECONDS, POOLS, Cluster, running_operator, secret
from support.outbox_rows import insert_backlog
from support.waiting import wait_for

NAME = "e2e"
DEPLOYMENT = f"{NAME}-worker"
POLL_SECONDS = 1
STABILISATION_SECONDS = 2

POOL: dict[str, Any] = {
    "apiVersion": "leasebox.dev/v1alpha1",
    "kind": "OutboxWorkerPool",
    "metadata": {"name": NAME, "namespace": "default"},
    "spec": {
        "kinds": ["otp"],
        "database": {"secretRef": {"name": "leasebox-database"}},
        "provider": {"secretRef": {"name": "leasebox-provider"}},
        "sla": {"oldestPendingAgeSeconds": 30},
        "scaling": {
            "minReplicas": 1,
            "maxReplicas": 8,
            "pollIntervalSeconds": POLL_SECONDS,
            "scaleDownStabilizationSeconds": STABILISATION_SECONDS,
            "initialWorkerThroughput": 10,
            "startupSeconds": 1,
        },
    },
}


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


@pytest.fixture
def operator_process(
    kube_emulator: KubeEmulator, database: Database, tmp_path: Path
) -> Iterator[tuple[Cluster, int]]:
    """`leasebox operator` watching the emulated cluster's default namespace."""
    with running_operator(kube_emulator, database.dsn, tmp_path) as metrics_port:
        yield Cluster(kube_emulator, NAME), metrics_port


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


POLLS = "leasebox_operator_poll_duration_seconds_count"
FAILED_POLLS = f'leasebox_operator_poll_errors_total{{namespace="default",pool="{NAME}"}}'


def _sample(port: int, sample: str) -> float:
    """The value of one sample of the operator's metrics (0 while it is absent)."""
    for line in _metrics(port).splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _show(title: str, payload: Any) -> None:
    print(
        f"\n=== {title} ===\n"
        + yaml.safe_dump(payload, sort_keys=False, width=120, allow_unicode=True)
    )


def test_operator_reconciles_scales_reports_and_cleans_up_a_pool(
    operator_process: tuple[Cluster, int], database: Database
) -> None:
    cluster, metrics_port = operator_process
    cluster.kube.create(*POOLS, json.loads(json.dumps(POOL)), namespace="default")

    # Applied: the Deployment, the PDB and the status appear.
    deployment = wait_for(
        cluster.deployment, what="the worker Deployment", timeout=OPERATOR_START_SECONDS
    )
    assert deployment["spec"]["replicas"] == 1
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "OutboxWorkerPool"
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    dsn_var = next(v for v in env if v["name"] == "LEASEBOX_DSN")
    assert dsn_var == {"name": "LEASEBOX_DSN", "valueFrom": {"secretKeyRef": {
        "name": "leasebox-database", "key": "dsn"}}}  # fmt: skip
    wait_for(
        lambda: cluster.kube.get("policy/v1", "poddisruptionbudgets", DEPLOYMENT,
                                 namespace="default"),
        what="the PodDisruptionBudget",
    )  # fmt: skip
    wait_for(lambda: cluster.condition_is("Ready", "True", "Available"), what="Ready=True")
    wait_for(lambda: cluster.condition_is("DatabaseReachable", "True"), what="database reachable")

    # A backlog arrives: replicas go up within two polls (counted, not timed): the one under
    # way when the rows arrived, and the next, which sees them. One more may have finished
    # between the two reads below. The status shows the backlog.
    polls = _sample(metrics_port, POLLS)
    database.insert_backlog(600)
    polls_at_scale_up = wait_for(
        lambda: _sample(metrics_port, POLLS) if (cluster.replicas() or 0) > 1 else None,
        what="a scale-up",
        timeout=60,
    )
    assert polls_at_scale_up - polls <= 3
    wait_for(lambda: cluster.status().get("backlog", {}).get("pending") == 600,
             what="the backlog in the status")  # fmt: skip
    scaled_up = wait_for(
        lambda: next((e for e in cluster.events() if e["reason"] == "ScaledUp"), None),
        what="the ScaledUp Event",
    )
    assert scaled_up["message"].startswith("scale up 1→")
    assert "SLA" in scaled_up["message"]
    assert "backlog 600" in scaled_up["message"]
    metrics = _metrics(metrics_port)
    assert 'leasebox_pool_messages{namespace="default",pool="e2e",state="pending"} 600.0' in metrics
    assert 'leasebox_pool_sla_seconds{namespace="default",pool="e2e"} 30.0' in metrics

    # Drained: replicas come down to minReplicas once the stabilisation window has passed.
    database.drain()
    wait_for(lambda: cluster.replicas() == 1, what="the scale-down to minReplicas",
             timeout=60)  # fmt: skip
    wait_for(lambda: "ScaledDown" in cluster.event_reasons(), what="the ScaledDown Event")
    wait_for(lambda: cluster.status().get("lastScaleReason", "").startswith("scale down"),
             what="the scale-down reason in the status")  # fmt: skip

    # The database goes away: replicas kept, DatabaseReachable=False, an Event; then back.
    database.insert_backlog(50)
    wait_for(lambda: cluster.status().get("backlog", {}).get("pending") == 50,
             what="the new backlog")  # fmt: skip
    before = cluster.replicas()
    database.allow_connections(False)
    wait_for(lambda: cluster.condition_is("DatabaseReachable", "False", "ConnectionFailed"),
             what="DatabaseReachable=False")  # fmt: skip
    failed = _sample(metrics_port, FAILED_POLLS)
    wait_for(lambda: _sample(metrics_port, FAILED_POLLS) >= failed + 3,
             what="three more failed polls", timeout=60)  # fmt: skip
    assert cluster.replicas() == before
    wait_for(lambda: "DatabaseUnreachable" in cluster.event_reasons(), what="the outage Event")
    assert database.dsn not in json.dumps(cluster.status())
    database.allow_connections(True)
    wait_for(lambda: cluster.condition_is("DatabaseReachable", "True"), what="recovery")

    # Paused: the workers go to zero and a new backlog changes nothing but the report.
    cluster.patch_spec({"paused": True})
    wait_for(lambda: cluster.condition_is("Paused", "True"), what="Paused=True")
    wait_for(lambda: cluster.replicas() == 0, what="the paused pool at zero")
    frozen = cluster.replicas()
    database.insert_backlog(2000)
    wait_for(lambda: cluster.status().get("backlog", {}).get("pending") == 2050,
             what="the paused pool's backlog")  # fmt: skip
    seen = _sample(metrics_port, POLLS)  # polls that saw the paused pool's whole backlog
    wait_for(lambda: _sample(metrics_port, POLLS) >= seen + 3, what="three more polls",
             timeout=60)  # fmt: skip
    assert cluster.replicas() == frozen
    _show("status of pool default/e2e (paused, backlog waiting)", cluster.status())

    # Invalid spec: Ready=False with the reason, no crash loop.
    cluster.patch_spec({"scaling": {"minReplicas": 9}})
    wait_for(lambda: cluster.condition_is("Ready", "False", "InvalidSpec"), what="InvalidSpec")
    assert "minReplicas must not exceed maxReplicas" in cluster.condition_message("Ready")
    assert cluster.replicas() == frozen
    wait_for(lambda: "InvalidSpec" in cluster.event_reasons(), what="the InvalidSpec Event")
    # One Event per fact, all the operator's own: kopf posts none of its Logging/Error ones.
    components = {e.get("reportingComponent") for e in cluster.events()}
    assert components == {"leasebox-operator"}
    assert cluster.event_reasons().count("InvalidSpec") == 1
    _show("events of pool default/e2e", [
        {"type": e.get("type"), "reason": e.get("reason"), "message": e.get("message")}
        for e in cluster.events()
    ])  # fmt: skip

    # Deleted: the children go with it.
    cluster.kube.delete(*POOLS, NAME, namespace="default")
    wait_for(lambda: cluster.pool() is None, what="the pool to be gone")
    wait_for(lambda: cluster.deployment() is None, what="the Deployment to be collected")
    assert cluster.kube.get("policy/v1", "poddisruptionbudgets", DEPLOYMENT,
                            namespace="default") is None  # fmt: skip


def test_a_pool_whose_secret_is_missing_says_so_and_recovers_when_it_appears(
    operator_process: tuple[Cluster, int], database: Database
) -> None:
    cluster = Cluster(operator_process[0].kube, "late")
    pool = json.loads(json.dumps(POOL))
    pool["metadata"]["name"] = "late"
    pool["spec"]["database"] = {"secretRef": {"name": "late-database"}}
    cluster.kube.create(*POOLS, pool, namespace="default")

    wait_for(lambda: cluster.condition_is("Ready", "False", "SecretNotFound"),
             what="Ready=False SecretNotFound")  # fmt: skip
    assert "Secret default/late-database does not exist" in cluster.condition_message("Ready")
    wait_for(lambda: "SecretNotFound" in cluster.event_reasons(), what="the SecretNotFound Event")
    assert cluster.event_reasons().count("SecretNotFound") == 1
    assert cluster.deployment() is None  # nothing half-made

    cluster.kube.create("v1", "secrets", secret("late-database", "dsn", database.dsn))
    wait_for(cluster.deployment, what="the Deployment once the Secret exists")
    wait_for(lambda: cluster.condition_is("Ready", "True", "Available"), what="Ready=True")
