"""`kubectl leasebox` on the real control plane, run by the real kubectl as a plugin.

A pool of the chart's operator delivers through an SMTP sink that rejects one mailbox, so
that dead letters exist; the plugin (the `kubectl-leasebox` console script on the PATH)
reads the pool through the API with the administrator's kubeconfig and the database through
the pool's own Secret: its status tells the verdict, the facts, the worker pod, the backlog
per kind with the dead letters, the conditions and the Events, as text, JSON and YAML;
`redrive` requeues the dead letters (they are delivered once the mailbox accepts) and leaves
an audit row; `pause` takes the workers to zero and holds them, `resume` brings them back.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from leasebox import OutboxMessage, enqueue
from leasebox.testing.smtp_sink import SmtpSink
from support.cluster.controlplane import ControlPlane
from support.cluster.release import Pool, secret
from support.cluster.rest import Rest
from support.pace import wait_for

NAME = "mail"
BOUNCING = "bounce@example.com"


def _manifest(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "leasebox.dev/v1alpha1",
        "kind": "OutboxWorkerPool",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "kinds": ["otp", "verification"],
            "database": {"secretRef": {"name": "leasebox-database"}},
            "provider": {"secretRef": {"name": "leasebox-provider"}},
            "sla": {"oldestPendingAgeSeconds": 30},
            "scaling": {"minReplicas": 1, "maxReplicas": 2, "pollIntervalSeconds": 1},
            "worker": {"env": [{"name": "LEASEBOX_POLL_INTERVAL", "value": "0.2"}]},
        },
    }


def _dead(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM leasebox.queue WHERE status = 'dead'").fetchone()
    return int(row[0]) if row else 0


def test_status_redrive_pause_and_resume_through_kubectl(
    release: str,
    control_plane: ControlPlane,
    kube: Rest,
    namespace: str,
    empty_db_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    del release
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    def plugin(*args: str) -> str:
        return control_plane.kubectl("leasebox", *args, "-n", namespace).stdout

    with SmtpSink(rejected=[BOUNCING]) as sink:
        dsn = empty_db_dsn
        kube.create("v1", "secrets", secret("leasebox-database", "dsn", dsn, namespace), namespace)
        kube.create(
            "v1", "secrets", secret("leasebox-provider", "url", sink.url, namespace), namespace
        )
        control_plane.kubectl(
            "apply", "--server-side", "-f", "-", stdin=json.dumps(_manifest(namespace))
        )
        pool = Pool(kube, NAME, namespace)
        wait_for(lambda: pool.ready_pods() >= 1, what="a ready worker pod", timeout=120)
        with psycopg.connect(dsn) as conn:
            for n, recipient in enumerate(["a@example.com", "b@example.com", BOUNCING, BOUNCING]):
                enqueue(
                    conn,
                    OutboxMessage(
                        kind="verification",
                        recipient=recipient,
                        data={"link": f"https://app.example.com/verify/{n}"},
                    ),
                    idempotency_key=f"k{n}",
                )
            conn.commit()
        wait_for(lambda: _dead(dsn) == 2, what="two dead letters", timeout=60)
        wait_for(lambda: len(sink.received) == 2, what="two deliveries", timeout=60)
        pool.wait_condition("Ready", "True", "Available", timeout=60)

        text = plugin("status", NAME)
        lines = text.splitlines()
        assert lines[0].startswith("SLA met: the oldest pending message is")
        assert f"Name:       {namespace}/{NAME}" in text
        assert "Kinds:      otp, verification" in text
        assert "Paused:     no" in text
        (pod,) = [p["metadata"]["name"] for p in kube.list("v1", "pods", namespace)]
        assert any(line.strip().startswith(pod) and "Running" in line for line in lines)
        row = next(line.split() for line in lines if line.strip().startswith("verification "))
        assert row[:5] == ["verification", "0", "0", "0", "2"]  # pending, ready, processing, dead
        assert any(line.split()[:3] == ["Ready", "True", "Available"] for line in lines)
        assert "Recent events" in text
        assert "(none)" not in text.split("Recent events")[1]

        as_json = json.loads(plugin("status", NAME, "-o", "json"))
        assert as_json["slaMet"] is True
        assert as_json["database"] == {"read": True, "problem": None}
        assert {r["kind"]: r["dead"] for r in as_json["backlog"]} == {"otp": 0, "verification": 2}
        assert [r["pod"] for r in as_json["replicas"]] == [pod]
        as_yaml = yaml.safe_load(plugin("status", NAME, "-o", "yaml"))
        assert (as_yaml["pool"], as_yaml["slaSeconds"]) == (as_json["pool"], 30.0)
        assert {r["kind"]: r["dead"] for r in as_yaml["backlog"]} == {"otp": 0, "verification": 2}
        assert dsn not in text

        assert plugin("redrive", NAME, "--dry-run").strip() == (
            "would requeue 2 dead letters of otp, verification (dry run)"
        )
        sink.rejected = frozenset()
        assert plugin("redrive", NAME, "--error-class", "smtp_550").strip() == (
            f"requeued 2 dead letters of otp, verification in pool {NAME}"
        )
        wait_for(lambda: len(sink.received) == 4, what="the redriven letters", timeout=60)
        assert _dead(dsn) == 0
        with psycopg.connect(dsn) as conn:
            audit = conn.execute(
                "SELECT actor, action, outcome, affected FROM leasebox.audit"
            ).fetchall()
        ((actor, action, outcome, affected),) = audit
        assert actor.startswith("kubectl:")
        assert (action, outcome, affected) == ("redrive", "done", 2)

        assert "paused" in plugin("pause", NAME)
        wait_for(lambda: pool.replicas() == 0, what="the workers at zero", timeout=60)
        pool.wait_condition("Paused", "True", "PausedBySpec")
        (wide,) = control_plane.table("owp", "-n", namespace, "-o", "wide")
        assert wide["PAUSED"] == "true"
        paused = plugin("status", NAME)
        assert "The pool is paused: its workers are held at 0." in paused.splitlines()[0]
        assert "Paused:     yes (workers held at 0)" in paused

        assert "resumed" in plugin("resume", NAME)
        wait_for(lambda: pool.replicas() == 1, what="the workers back", timeout=60)
        pool.wait_condition("Paused", "False", "Active")

    missing = control_plane.kubectl("leasebox", "status", "nope", "-n", namespace, check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"kubectl leasebox: error: OutboxWorkerPool {namespace}/nope does not exist"
    )
