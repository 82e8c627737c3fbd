"""Running a pod template as local processes, as a node's kubelet would run one pod.

The emulated API has no nodes, so a test that wants the worker pods to *run* (their init
container migrating the schema, the worker claiming and sending) runs the containers of the
Deployment's pod template here: the image is leasebox's, so a container is
`python -m leasebox.cli` with the container's `args`; its environment is resolved from
`value`, Secret and ConfigMap keys (read from the emulated API) and the downward API, as
the kubelet resolves it. Each pod gets its own metrics port, as it would its own network.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.kube.emulator import KubeEmulator

Body = dict[str, Any]


class Kubelet:
    """Runs containers of one pod of a Deployment in the emulated cluster."""

    def __init__(self, kube: KubeEmulator, namespace: str, pod_name: str, workdir: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pod_name = pod_name
        self.workdir = workdir
        self.processes: list[subprocess.Popen[bytes]] = []

    def _key(self, plural: str, ref: Body) -> str:
        found = self.kube.get("v1", plural, ref["name"], self.namespace)
        if found is None:
            raise AssertionError(f"{plural} {ref['name']} does not exist: the pod cannot start")
        if plural == "secrets":
            return base64.b64decode(found["data"][ref["key"]]).decode()
        return str(found["data"][ref["key"]])

    def environment(self, container: Body, overrides: dict[str, str]) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.workdir)}
        for var in container.get("env", []):
            source = var.get("valueFrom") or {}
            if "value" in var:
                env[var["name"]] = var["value"]
            elif "secretKeyRef" in source:
                env[var["name"]] = self._key("secrets", source["secretKeyRef"])
            elif "configMapKeyRef" in source:
                env[var["name"]] = self._key("configmaps", source["configMapKeyRef"])
            elif "fieldRef" in source:
                fields = {"metadata.name": self.pod_name, "metadata.namespace": self.namespace}
                env[var["name"]] = fields.get(source["fieldRef"]["fieldPath"], "")
        return env | overrides

    def command(self, container: Body) -> list[str]:
        return [sys.executable, "-m", "leasebox", *container.get("args", [])]

    def run_to_completion(
        self, container: Body, overrides: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """An init container: run it and return how it ended."""
        return subprocess.run(
            self.command(container), env=self.environment(container, overrides),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    def start(self, container: Body, overrides: dict[str, str]) -> subprocess.Popen[bytes]:
        """A long-running container; its output goes to `<workdir>/<name>.log`."""
        log = (self.workdir / f"{self.pod_name}-{container['name']}.log").open("wb")
        process = subprocess.Popen(
            self.command(container), env=self.environment(container, overrides),
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
