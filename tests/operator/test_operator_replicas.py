"""Two operator replicas never both scale one pool; the standby takes over when it goes.

Both run with kopf peering, as the chart runs them when `operator.replicas > 1`: the
operator creates kopf's peering object at start-up, the higher priority works and the
other pauses (kopf stops its daemons, so its poll loop stops too). Every write to the
workers' `/scale` subresource is read from the emulated API's request log, with the
user-agent that names the instance that sent it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from support.kube.emulator import KubeEmulator
from support.kube.harness import (
    OPERATOR_START_SECONDS,
    POOLS,
    Cluster,
    OperatorProcess,
    prepare_cluster,
)
from support.outbox_rows import insert_backlog
from support.waiting import wait_for

NAME = "ha"
POOL: dict[str, Any] = {
    "apiVersion": "leasebox.dev/v1alpha1",
    "kind": "OutboxWorkerPool",
    "metadata": {"name": NAME, "namespace": "default"},
    "spec": {
        "kinds": ["otp"],
        "database": {"secretRef": {"name": "leasebox-database"}},
        "provider": {"secretRef": {"name": "leasebox-provider"}},
        "sla": {"oldestPendingAgeSeconds": 30},
        "scaling": {"minReplicas": 1, "maxReplicas": 8, "pollIntervalSeconds": 1,
                    "scaleDownStabilizationSeconds": 1, "initialWorkerThroughput": 10,
                    "startupSeconds": 1},
    },
}  # fmt: skip
PEERING = ["--namespace", "default", "--peering-name", "leasebox"]


def _scalers(kube: KubeEmulator) -> list[str]:
    """The user-agent of every write to the workers' scale subresource, in order."""
    path = f"/apis/apps/v1/namespaces/default/deployments/{NAME}-worker/scale"
    agents = []
    for request in kube.api._requests:  # kmock's request log
        if request.method == "PATCH" and request.url.path == path:
            headers = {key.lower(): value for key, value in request.headers.items()}
            agents.append(headers.get("user-agent", ""))
    return agents


def _peers(kube: KubeEmulator) -> dict[str, Any]:
    peering = kube.get("kopf.dev/v1", "kopfpeerings", "leasebox", "default") or {}
    return dict(peering.get("status") or {})


def _backlog(dsn: str, count: int) -> None:
    with psycopg.connect(dsn) as conn:
        insert_backlog(conn, count, prefix="ha")


@pytest.fixture
def operators(
    kube_emulator: KubeEmulator, db_dsn: str, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    prepare_cluster(kube_emulator, db_dsn)
    leader = OperatorProcess(kube_emulator, tmp_path, flags=[*PEERING, "--priority", "20"],
                             identity="operator-a")  # fmt: skip
    standby: OperatorProcess | None = None
    try:
        kube_emulator.create(*POOLS, json.loads(json.dumps(POOL)), namespace="default")
        cluster = Cluster(kube_emulator, NAME)
        wait_for(lambda: cluster.condition_is("Ready", "True"), what="the leader to work",
                 timeout=OPERATOR_START_SECONDS)  # fmt: skip
        standby = OperatorProcess(kube_emulator, tmp_path, flags=[*PEERING, "--priority", "10"],
                                  identity="operator-b")  # fmt: skip
        # kopf starts an operator paused; a live peer of higher priority keeps it so.
        wait_for(lambda: "operator-b" in _peers(kube_emulator), what="the standby's keep-alive",
                 timeout=OPERATOR_START_SECONDS)  # fmt: skip
        yield leader, standby
    finally:
        leader.stop()
        if standby is not None:
            standby.stop()


def test_only_the_leader_scales_and_the_standby_takes_over_when_it_stops(
    operators: tuple[OperatorProcess, OperatorProcess], kube_emulator: KubeEmulator, db_dsn: str
) -> None:
    leader, standby = operators
    cluster = Cluster(kube_emulator, NAME)
    assert set(_peers(kube_emulator)) == {"operator-a", "operator-b"}  # created at start-up
    assert "Resuming operations" not in standby.log_path.read_text()

    _backlog(db_dsn, 500)
    wait_for(lambda: (cluster.replicas() or 0) > 1, what="a scale-up by the leader")
    assert _scalers(kube_emulator)
    assert all("(operator-a)" in agent for agent in _scalers(kube_emulator))

    leader.stop()  # kopf removes it from the peering as it exits
    wait_for(lambda: "Resuming operations" in standby.log_path.read_text(),
             what="the standby to resume", timeout=20)  # fmt: skip
    assert set(_peers(kube_emulator)) == {"operator-b"}
    before = len(_scalers(kube_emulator))
    with psycopg.connect(db_dsn) as conn:
        conn.execute("DELETE FROM leasebox.queue")  # as if every message had been sent
    wait_for(lambda: cluster.replicas() == 1, what="the scale-down by the new leader",
             timeout=20)  # fmt: skip
    later = _scalers(kube_emulator)[before:]
    assert later
    assert all("(operator-b)" in agent for agent in later)
