"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

The envtest pattern: the programs are the real ones, built from the Kubernetes modules at
one pinned release (`tools/bin/build-controlplane`, cached outside the work tree), started
once per test session with certificates made for it, RBAC on, and service-account signing
keys, so that TokenRequest works and a client can act as any ServiceAccount. The
controller-manager runs the controllers the tests rely on (deployments, replica sets, the
garbage collector, service accounts, namespaces, the HPA, disruption budgets); no scheduler
and no kubelet run: `support.cluster.kubelet` is the node.

Each program can be stopped and started again on the same ports and data, which is how a
test restarts the API server or etcd under a running operator.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from leasebox.testing.ports import free_port
from support.cluster.pki import Pki, make_pki

ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = ROOT / "tools" / "bin" / "build-controlplane"
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "namespace-controller",
    "horizontal-pod-autoscaler-controller",
    "disruption-controller",
    "root-ca-certificate-publisher-controller",
)
# Every request of a ServiceAccount is logged, for the RBAC coverage check.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


class ControlPlaneUnavailable(Exception):
    """The programs cannot be built here (no Go toolchain): the cluster tests cannot run."""


def build_programs() -> Path:
    """The folder of the built programs, building them on first use."""
    if shutil.which("go") is None:
        raise ControlPlaneUnavailable(
            "Go is not installed: the cluster tests build kube-apiserver and etcd from Go "
            "modules; install Go 1.26 or newer (https://go.dev/doc/install), then run "
            "`make cluster-programs`"
        )
    done = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, check=False, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the control plane failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class _Program:
    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class ControlPlane:
    """The three programs, their ports and files; `start()` returns once the API is ready."""

    folder: Path
    programs: Path
    etcd_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    pki: Pki = field(init=False)
    etcd: _Program = field(init=False)
    apiserver: _Program = field(init=False)
    controller_manager: _Program = field(init=False)
    warming: list[tuple[datetime, datetime]] = field(default_factory=list)
    start_seconds: float = 0.0  # how long `start` took: the session's measure of this machine

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.folder / "pki")
        self.audit_log = self.folder / "audit.log"
        policy = self.folder / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY), encoding="utf-8")
        self.admin_kubeconfig = self.write_kubeconfig(
            self.folder / "admin.kubeconfig", cert=self.pki.admin.cert, key=self.pki.admin.key
        )
        manager_kubeconfig = self.write_kubeconfig(
            self.folder / "controller-manager.kubeconfig",
            cert=self.pki.controller_manager.cert,
            key=self.pki.controller_manager.key,
        )
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.etcd = _Program(
            "etcd",
            [
                str(self.programs / "etcd"),
                "--name=test",
                f"--data-dir={self.folder / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            self.folder / "etcd.log",
        )
        self.apiserver = _Program(
            "kube-apiserver",
            [
                str(self.programs / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={self.pki.server.cert}",
                f"--tls-private-key-file={self.pki.server.key}",
                f"--client-ca-file={self.pki.ca}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.pki.service_account_public}",
                f"--service-account-signing-key-file={self.pki.service_account_key}",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--allow-privileged=true",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--profiling=false",
                f"--cert-dir={self.folder / 'apiserver-certs'}",
            ],
            self.folder / "kube-apiserver.log",
        )
        self.controller_manager = _Program(
            "kube-controller-manager",
            [
                str(self.programs / "kube-controller-manager"),
                f"--kubeconfig={manager_kubeconfig}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--leader-elect=false",
                f"--root-ca-file={self.pki.ca}",
                f"--service-account-private-key-file={self.pki.service_account_key}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--horizontal-pod-autoscaler-sync-period=2s",
                "--horizontal-pod-autoscaler-downscale-stabilization=0s",
            ],
            self.folder / "kube-controller-manager.log",
        )

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def write_kubeconfig(
        self,
        path: Path,
        *,
        cert: Path | None = None,
        key: Path | None = None,
        token: str | None = None,
        namespace: str = "default",
    ) -> Path:
        """A kubeconfig for this cluster, by client certificate or by bearer token."""
        user: dict[str, str] = {}
        if cert and key:
            user = {"client-certificate": str(cert), "client-key": str(key)}
        if token:
            user = {"token": token}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.pki.ca)},
                }
            ],
            "users": [{"name": "test", "user": user}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": "test", "namespace": namespace},
                }
            ],
        }
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
        path.chmod(0o600)
        return path

    def _tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        return context

    def ready(self) -> bool:
        """Whether the API server answers /readyz with ok (as the administrator)."""
        try:
            with urllib.request.urlopen(
                f"{self.url}/readyz", timeout=5, context=self._tls()
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _wait(self, program: _Program, probe: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not program.alive():
                raise RuntimeError(f"{program.name} exited:\n{program.tail()}")
            if callable(probe) and probe():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{program.name} was not ready in {timeout:g}s:\n{program.tail()}")

    def _etcd_healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.etcd_port}/health"
            with urllib.request.urlopen(url, timeout=3) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def start_etcd(self, timeout: float = 60) -> None:
        self.etcd.start()
        self._wait(self.etcd, self._etcd_healthy, timeout)

    def start_apiserver(self, timeout: float = 120) -> None:
        """Start the API server; remember when it served requests before it was ready."""
        began = datetime.now(UTC)
        self.apiserver.start()
        self._wait(self.apiserver, self.ready, timeout)
        self.warming.append((began, datetime.now(UTC)))

    def while_warming(self, entry: dict[str, Any]) -> bool:
        """Whether an audit entry was received while the API server was starting.

        A starting server answers before its RBAC caches are filled, and refuses everyone
        in that window; clients retry. Such refusals say nothing about the chart's rules.
        """
        received = datetime.fromisoformat(str(entry.get("requestReceivedTimestamp", "")))
        return any(began <= received <= ready for began, ready in self.warming)

    def start(self) -> ControlPlane:
        """Start etcd, the API server and the controller manager; time it (`start_seconds`)."""
        began = time.monotonic()
        self.start_etcd()
        self.start_apiserver()
        self.controller_manager.start()
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        for program in (self.controller_manager, self.apiserver, self.etcd):
            program.stop()

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """The pinned kubectl against this cluster (as the administrator by default)."""
        done = subprocess.run(
            [str(self.programs / "kubectl"), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "KUBECONFIG": str(kubeconfig or self.admin_kubeconfig)},
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}"
            )
        return done

    def table(self, *args: str, kubeconfig: Path | None = None) -> list[dict[str, str]]:
        """`kubectl get ARGS` as rows of {column: cell}, cut at the header's columns."""
        header, *lines = self.kubectl("get", *args, kubeconfig=kubeconfig).stdout.splitlines()
        names = header.split()
        starts = [header.index(name) for name in names]
        ends = [*starts[1:], None]
        return [
            {
                name: line[start:end].strip()
                for name, start, end in zip(names, starts, ends, strict=True)
            }
            for line in lines
        ]

    def token(self, namespace: str, service_account: str, *, seconds: int = 7200) -> str:
        """A token of a ServiceAccount from the TokenRequest API."""
        done = self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={seconds}s"
        )
        return done.stdout.strip()

    def audit_entries(self) -> list[dict[str, Any]]:
        """Every request of a ServiceAccount the API server has logged so far."""
        if not self.audit_log.exists():
            return []
        return [
            json.loads(line)
            for line in self.audit_log.read_text(errors="replace").splitlines()
            if line.strip()
        ]


def start_control_plane(folder: Path) -> ControlPlane:
    """Build (once) and start a control plane whose files live in `folder`."""
    plane = ControlPlane(folder, build_programs())
    try:
        return plane.start()
    except BaseException:
        plane.stop()
        raise
