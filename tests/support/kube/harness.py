"""Running `leasebox operator` against the emulated cluster, shared by the end-to-end tests.

The operator runs as a real subprocess (the way a pod runs it) with KUBECONFIG pointing at
the emulator; the test reads the cluster through the emulator's direct accessors.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from leasebox.testing.ports import free_port
from leasebox_operator.crd import custom_resource_definition
from support.kube.emulator import KubeEmulator

POOLS = ("leasebox.dev/v1alpha1", "outboxworkerpools")


def secret(name: str, key: str, value: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": {key: base64.b64encode(value.encode()).decode()},
    }


class Cluster:
    """One pool in the emulated cluster, as the test sees it."""

    def __init__(self, kube: KubeEmulator, name: str, namespace: str = "default") -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.deployment_name = f"{name}-worker"

    def pool(self) -> dict[str, Any] | None:
        return self.kube.get(*POOLS, self.name, namespace=self.namespace)

    def status(self) -> dict[str, Any]:
        return dict((self.pool() or {}).get("status") or {})

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status().get("conditions", []) if c["type"] == kind), None)

    def condition_message(self, kind: str) -> str:
        """The message of the pool's condition `kind` ("" while it has none)."""
        found = self.condition(kind)
        return str(found["message"]) if found else ""

    def condition_is(self, kind: str, status: str, reason: str | None = None) -> bool:
        found = self.condition(kind)
        return bool(found and found["status"] == status and reason in (None, found["reason"]))

    def deployment(self) -> dict[str, Any] | None:
        return self.kube.get(
            "apps/v1", "deployments", self.deployment_name, namespace=self.namespace
        )

    def replicas(self) -> int | None:
        found = self.deployment()
        return None if found is None else int(found["spec"]["replicas"])

    def patch_spec(self, spec: dict[str, Any]) -> None:
        self.kube.patch(*POOLS, self.name, {"spec": spec}, namespace=self.namespace)

    def events(self) -> list[dict[str, Any]]:
        found = [
            e
            for e in self.kube.events(self.namespace)
            if (e.get("involvedObject") or e.get("regarding") or {}).get("name") == self.name
        ]
        return sorted(found, key=lambda e: int(e["metadata"].get("resourceVersion", 0)))

    def event_reasons(self) -> list[str]:
        return [str(e.get("reason")) for e in self.events()]


def prepare_cluster(kube: KubeEmulator, database_dsn: str, provider_url: str = "log://") -> None:
    """What an install leaves behind: the CRD, and the two Secrets a pool refers to."""
    kube.apply_crd(custom_resource_definition())
    kube.create("v1", "secrets", secret("leasebox-database", "dsn", database_dsn))
    kube.create("v1", "secrets", secret("leasebox-provider", "url", provider_url))


# How long a test waits for a new operator's first answer (the pool's first child): it
# includes the process's start-up (imports, login, the first watch), which a loaded machine
# stretches to several seconds. Later answers come within `wait_for`'s default.
OPERATOR_START_SECONDS = 60.0


class OperatorProcess:
    """One `leasebox operator` subprocess against the emulated cluster."""

    def __init__(
        self, kube: KubeEmulator, workdir: Path, *, flags: Sequence[str], identity: str
    ) -> None:
        self.identity = identity
        self.metrics_port = free_port()
        self.log_path = workdir / f"operator-{identity}.log"
        env = {
            **os.environ,
            "KUBECONFIG": str(kube.write_kubeconfig(workdir / "kubeconfig")),
            "POD_ID": identity,
            "LEASEBOX_OPERATOR_CONNECT_TIMEOUT": "1",
            "LEASEBOX_OPERATOR_MAX_POLL_BACKOFF": "1",
            "LEASEBOX_OPERATOR_API_BACKOFFS": "0.2,0.5",
            "LEASEBOX_OPERATOR_RESYNC": "2",
        }
        command = [
            sys.executable, "-m", "leasebox", "operator", "--liveness", "none",
            "--metrics-port", str(self.metrics_port), "--log-format", "plain", *flags,
            *os.environ.get("LEASEBOX_E2E_OPERATOR_FLAGS", "").split(),
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> str:
        """SIGTERM, wait, and return the log (which must hold no traceback)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        log_text = self.log_path.read_text(errors="replace")
        print(f"\n--- operator {self.identity} log (tail) ---\n"
              + "\n".join(log_text.splitlines()[-40:]))  # fmt: skip
        assert "Traceback" not in log_text, f"operator {self.identity} logged a traceback"
        return log_text


@contextmanager
def running_operator(
    kube: KubeEmulator, database_dsn: str, workdir: Path, *, provider_url: str = "log://"
) -> Iterator[int]:
    """The CRD and Secrets applied, `leasebox operator` running; yields its metrics port.

    On exit the operator gets SIGTERM; its log must hold no traceback and no DSN.
    """
    prepare_cluster(kube, database_dsn, provider_url)
    flags = ["--namespace", "default", "--standalone"]
    operator = OperatorProcess(kube, workdir, flags=flags, identity="operator-0")
    try:
        yield operator.metrics_port
    finally:
        assert database_dsn not in operator.stop()
