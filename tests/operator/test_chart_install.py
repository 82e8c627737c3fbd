"""From the chart alone to mail sent: install, Secrets, a pool; the workers migrate and start.

As a platform team would: the CRD and the operator's command line come from `helm
template` of the chart (real Helm), the database is a fresh, empty PostgreSQL, and the pool
customises its pods. The emulated API has no nodes, so `support.kube.kubelet` runs the
pod template the operator wrote: its `migrate` init container creates the schema, then the
worker starts and sends. Along the way the pool's status, conditions and Events must say
what is going on, a Deployment edited by hand is put back, and every operator log line is
one JSON object in the worker's log schema.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import helm_python as helm
import psycopg
import yaml

from leasebox import OutboxMessage, enqueue
from leasebox.testing.ports import free_port
from support.kube.emulator import KubeEmulator
from support.kube.harness import OPERATOR_START_SECONDS, POOLS, Cluster, OperatorProcess, secret
from support.kube.kubelet import Kubelet
from support.waiting import wait_for

CHART = Path(__file__).resolve().parents[2] / "charts" / "leasebox"
NAME = "otp"
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "identity"}, "annotations": {"mesh.example/inject": "true"}},
    "spec": {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mail",
                         "effect": "NoSchedule"}],
        "priorityClassName": "mail-critical",
        "imagePullSecrets": [{"name": "registry"}],
    },
}  # fmt: skip
POOL: dict[str, Any] = {
    "apiVersion": "leasebox.dev/v1alpha1",
    "kind": "OutboxWorkerPool",
    "metadata": {"name": NAME, "namespace": "default"},
    "spec": {
        "kinds": ["otp"],
        "database": {"secretRef": {"name": "leasebox-database"}},
        "provider": {"secretRef": {"name": "leasebox-provider"}},
        "scaling": {"minReplicas": 1, "maxReplicas": 3, "pollIntervalSeconds": 1},
        "worker": {"podTemplate": TEMPLATE,
                   "env": [{"name": "LEASEBOX_POLL_INTERVAL", "value": "0.2"}]},
    },
}  # fmt: skip


def _rendered() -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(None, name="leasebox", namespace="leasebox-system")
    return [doc for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]  # fmt: skip


def _operator_flags(objects: list[dict[str, Any]]) -> list[str]:
    """The chart's operator command line, with this machine's free ports."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator"
    kept = [a for a in args[1:] if not a.startswith(("--metrics-port", "--liveness"))]
    return [*kept, "--liveness", f"http://127.0.0.1:{free_port()}/healthz"]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _sent(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM leasebox.messages WHERE status = 'sent'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_pool_installed_from_the_chart_migrates_starts_and_sends(
    kube_emulator: KubeEmulator, empty_db_dsn: str, tmp_path: Path
) -> None:
    objects = _rendered()
    for crd in (o for o in objects if o["kind"] == "CustomResourceDefinition"):
        kube_emulator.apply_crd(crd)
    kube_emulator.create("v1", "secrets", secret("leasebox-database", "dsn", empty_db_dsn))
    kube_emulator.create("v1", "secrets", secret("leasebox-provider", "url", "log://"))
    operator = OperatorProcess(kube_emulator, tmp_path, flags=_operator_flags(objects),
                               identity="leasebox-6d9f-abcde")  # fmt: skip
    kubelet = Kubelet(kube_emulator, "default", f"{NAME}-worker-abc12", tmp_path)
    cluster = Cluster(kube_emulator, NAME)
    try:
        kube_emulator.create(*POOLS, json.loads(json.dumps(POOL)), namespace="default")
        deployment = wait_for(
            cluster.deployment, what="the worker Deployment", timeout=OPERATOR_START_SECONDS
        )
        template = deployment["spec"]["template"]
        for field, value in TEMPLATE["spec"].items():
            assert template["spec"][field] == value, field
        assert template["metadata"]["labels"]["team"] == "identity"
        (init,) = template["spec"]["initContainers"]
        (worker,) = template["spec"]["containers"]

        # The schema does not exist yet: the pool says so and who will fix it.
        wait_for(lambda: cluster.condition_is("Ready", "False", "SchemaMissing"),
                 what="Ready=False SchemaMissing")  # fmt: skip
        assert "init container" in (cluster.condition("Ready") or {})["message"]
        assert "SchemaMissing" in cluster.event_reasons()

        # The pod runs: the init container migrates, then the worker starts.
        migrated = kubelet.run_to_completion(init, {})
        assert migrated.returncode == 0, migrated.stderr
        port = free_port()
        kubelet.start(worker, {"LEASEBOX_METRICS_PORT": str(port)})
        wait_for(lambda: _ready(port), what="the worker's /readyz", timeout=30)
        wait_for(lambda: cluster.condition_is("Ready", "True", "Available"), what="Ready=True")
        assert "SchemaReady" in cluster.event_reasons()

        with psycopg.connect(empty_db_dsn) as conn:
            for n in range(5):
                enqueue(
                    conn,
                    OutboxMessage(
                        kind="otp",
                        recipient=f"u{n}@example.com",
                        aggregate_id=f"user-{n}",
                        data={"code": f"12345{n}", "minutes_valid": 10},
                    ),
                )
            conn.commit()  # fmt: skip
        wait_for(lambda: _sent(empty_db_dsn) == 5, what="the worker to send", timeout=30)

        # Drift made by hand is put back on the next resync.
        image = worker["image"]
        hand = {"template": {"spec": {"containers": [{"name": "worker", "image": "evil:1"}]}}}
        kube_emulator.patch("apps/v1", "deployments", f"{NAME}-worker", {"spec": hand}, "default")
        wait_for(lambda: (cluster.deployment() or {})["spec"]["template"]["spec"]["containers"][
            0]["image"] == image, what="the operator to put the image back")  # fmt: skip
    finally:
        kubelet.stop()
        log = operator.stop()
    for line in log.splitlines():
        entry = json.loads(line)  # every line is one JSON object
        assert {"time", "level", "logger", "message"} <= set(entry), line
    assert empty_db_dsn not in log
