"""The test cluster's node: a kubelet that runs each pod's containers as local processes.

No container runtime runs here, so this node runs the pod spec the API server stored the
way a kubelet would, with local processes in place of containers. It registers a Node,
binds every unscheduled pod whose nodeSelector it matches to it (there is no scheduler; a
pod that matches no node stays Pending, as on a cluster without room), and per pod: requests a token
of the pod's ServiceAccount from the TokenRequest API (bound to the pod) and hands it to
the containers as a kubeconfig; resolves `env` and `envFrom` from values, Secrets,
ConfigMaps and the downward API, waiting with `CreateContainerConfigError` while a Secret is
missing; runs the init containers to completion in order, then the containers, restarting
them as the restart policy says; probes readiness over HTTP; reports the pod's status
(phase, conditions, container states, exit codes, restart counts); and on deletion sends
SIGTERM, waits the grace period, kills, and removes the pod.

What a process on one host cannot have is imitated, and only that:
- The image: every container runs leasebox's image, so `leasebox ...` (the entrypoint) and
  `python ...` run from this interpreter; the image name is not looked at.
- The pod network: every pod has the host's loopback, so each declared container port gets
  a free host port, and the container's args and env that name the port are given that
  one; `host_port()` tells the tests which.
- Cluster DNS and Services: a process of a pod resolves `NAME.NAMESPACE.svc` names through
  a table this node writes (Services to the host port of a ready pod they select), by a
  `sitecustomize` hook on the pod's PYTHONPATH; no other program's name lookups change.
- Liveness probes are not acted on, and probes run at most a second apart.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from leasebox.testing.ports import free_port
from support.cluster.controlplane import ControlPlane
from support.cluster.rest import ApiError, Body, Rest

NODE = "leasebox-test-node"
NODE_LABELS = {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux"}
_SHIM = Path(__file__).resolve().parent / "pod_dns"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _ConfigError(Exception):
    """A container's configuration cannot be resolved yet (a missing Secret, say)."""


class _Container:
    """One container's process and the state the node reports for it."""

    def __init__(self, spec: Body) -> None:
        self.spec = spec
        self.name = str(spec["name"])
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.started_at = ""
        self.ready = False
        self.exit_code: int | None = None
        self.finished_at = ""
        self.waiting: tuple[str, str] | None = ("ContainerCreating", "")

    def poll(self) -> int | None:
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None and self.exit_code is None:
            self.exit_code = code
            self.finished_at = _now()
            self.ready = False
        return code

    def state(self) -> Body:
        if self.process is not None and self.exit_code is None:
            return {"running": {"startedAt": self.started_at}}
        if self.exit_code is not None:
            return {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": "Completed" if self.exit_code == 0 else "Error",
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                }
            }
        reason, message = self.waiting or ("ContainerCreating", "")
        return {"waiting": {"reason": reason, **({"message": message} if message else {})}}

    def status(self) -> Body:
        return {
            "name": self.name,
            "image": str(self.spec.get("image", "")),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restarts,
            "started": self.process is not None and self.exit_code is None,
            "state": self.state(),
        }


class PodRunner:
    """Runs one pod bound to the node, from its stored spec, until it is deleted."""

    def __init__(self, node: ProcessKubelet, pod: Body) -> None:
        self.node = node
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.spec: Body = pod["spec"]
        self.folder = node.folder / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.init = [_Container(c) for c in self.spec.get("initContainers", [])]
        self.containers = [_Container(c) for c in self.spec.get("containers", [])]
        self.ports: dict[int, int] = {}  # containerPort -> host port
        self.port_names: dict[str, int] = {}
        for container in self.spec.get("containers", []):
            for port in container.get("ports", []):
                host = free_port()
                self.ports[int(port["containerPort"])] = host
                if port.get("name"):
                    self.port_names[str(port["name"])] = host
        self.start_time = _now()
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)
        self._lock = threading.Lock()
        # Held while a process starts, and while `terminate` takes the processes to stop:
        # a container restarting as its pod is deleted must not outlive the pod.
        self._launching = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    # -- configuration -------------------------------------------------------------------
    def _key(self, plural: str, ref: Body) -> str | None:
        found = self.node.rest.get("v1", plural, ref["name"], self.namespace)
        data = (found or {}).get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            what = "secret" if plural == "secrets" else "configmap"
            missing = (
                f'{what} "{ref["name"]}" not found'
                if found is None
                else (f"couldn't find key {ref['key']} in {what} {self.namespace}/{ref['name']}")
            )
            raise _ConfigError(missing)
        value = data[ref["key"]]
        return base64.b64decode(value).decode() if plural == "secrets" else str(value)

    def _field(self, path: str) -> str:
        fields = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": NODE,
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
            "spec.serviceAccountName": str(self.spec.get("serviceAccountName", "default")),
        }
        return str(fields.get(path, ""))

    def _kubeconfig(self) -> Path | None:
        if self.spec.get("automountServiceAccountToken") is False:
            return None
        account = str(self.spec.get("serviceAccountName") or "default")
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 7200,
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": self.name,
                    "uid": self.uid,
                },
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token"
        try:
            token = self.node.rest.request("POST", path, request)["status"]["token"]
        except ApiError as exc:
            raise _ConfigError(f"no token for serviceaccount {account}: {exc}") from exc
        return self.node.plane.write_kubeconfig(
            self.folder / "kubeconfig", token=str(token), namespace=self.namespace
        )

    def _environment(self, spec: Body, kubeconfig: Path | None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.folder),
            "LANG": "C.UTF-8",
            "HOSTNAME": self.name,
            "PYTHONPATH": str(_SHIM),
            "LEASEBOX_TEST_SERVICES": str(self.node.services_file),
        }
        if kubeconfig:
            env["KUBECONFIG"] = str(kubeconfig)
        for source in spec.get("envFrom", []):
            prefix = str(source.get("prefix", ""))
            for plural, key in (("secrets", "secretRef"), ("configmaps", "configMapRef")):
                if key in source:
                    found = self.node.rest.get("v1", plural, source[key]["name"], self.namespace)
                    if found is None and not source[key].get("optional"):
                        raise _ConfigError(f'{plural[:-1]} "{source[key]["name"]}" not found')
                    for name, encoded in ((found or {}).get("data") or {}).items():
                        decoded = (
                            base64.b64decode(encoded).decode() if plural == "secrets" else encoded
                        )
                        env[prefix + name] = str(decoded)
        for var in spec.get("env", []):
            source = var.get("valueFrom") or {}
            value: str | None = None
            if "value" in var:
                value = self._expand(str(var["value"]), env)
            elif "secretKeyRef" in source:
                value = self._key("secrets", source["secretKeyRef"])
            elif "configMapKeyRef" in source:
                value = self._key("configmaps", source["configMapKeyRef"])
            elif "fieldRef" in source:
                value = self._field(source["fieldRef"]["fieldPath"])
            elif "value" not in var and not source:
                value = ""
            if value is not None:
                env[var["name"]] = self._to_host_port(value, whole=True)
        return env

    @staticmethod
    def _expand(text: str, env: dict[str, str]) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)

    def _to_host_port(self, text: str, *, whole: bool = False) -> str:
        if whole:
            return str(self.ports.get(int(text), text)) if text.isdigit() else text
        for container_port, host in self.ports.items():
            text = re.sub(rf"(?<=[=:]){container_port}\b", str(host), text)
        return text

    def _command(self, spec: Body, env: dict[str, str]) -> list[str]:
        command = [self._expand(str(c), env) for c in spec.get("command") or []]
        args = [self._to_host_port(self._expand(str(a), env)) for a in spec.get("args") or []]
        if not command:
            return [sys.executable, "-m", "leasebox", *(args or ["--help"])]
        if command[0] in {"python", "python3"}:
            command[0] = sys.executable
        elif command[0] == "leasebox":
            command[:1] = [sys.executable, "-m", "leasebox"]
        return [*command, *args]

    def _launch(self, container: _Container) -> bool:
        try:
            env = self._environment(container.spec, self._kubeconfig())
        except _ConfigError as exc:
            container.waiting = ("CreateContainerConfigError", str(exc))
            return False
        with self._launching:
            if self.stopping.is_set():
                return False
            with (self.folder / f"{container.name}.log").open("ab") as log:
                container.process = subprocess.Popen(
                    self._command(container.spec, env),
                    env=env,
                    cwd=self.folder,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        container.exit_code, container.waiting, container.started_at = None, None, _now()
        return True

    # -- running ------------------------------------------------------------------------
    def _probe(self, container: _Container) -> bool:
        probe = container.spec.get("readinessProbe")
        if not probe:
            return True
        get = probe.get("httpGet")
        if not get:
            return True
        port = get["port"]
        host = self.port_names.get(port) if isinstance(port, str) else self.ports.get(int(port))
        if host is None:
            return False
        try:
            url = f"http://127.0.0.1:{host}{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(200 <= response.status < 400)
        except OSError:
            return False

    def _restart_allowed(self, code: int) -> bool:
        policy = self.spec.get("restartPolicy", "Always")
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _run_init(self) -> bool:
        """Each init container to completion, in order; False if the pod failed or ended."""
        for container in self.init:
            while not self.stopping.is_set():
                if container.process is None:
                    launched = self._launch(container)
                    self._report()
                    if not launched:
                        self.stopping.wait(0.5)
                        continue
                assert container.process is not None
                try:
                    container.process.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    continue
                code = container.poll()
                self._report()
                if code == 0:
                    break
                if code is not None and not self._restart_allowed(code):
                    return False
                container.restarts += 1
                container.process = None
                self.stopping.wait(0.5)
        return not self.stopping.is_set()

    def _run(self) -> None:
        if not self._run_init():
            return self._hold()
        while not self.stopping.is_set():
            for container in self.containers:
                code = container.poll()
                if container.process is None:
                    self._launch(container)
                elif code is not None and self._restart_allowed(code):
                    container.restarts += 1
                    container.process = None
                    self._launch(container)
                elif code is None:
                    container.ready = self._probe(container)
            self._report()
            if all(
                c.exit_code is not None and not self._restart_allowed(c.exit_code)
                for c in self.containers
            ):
                return self._hold()
            self.stopping.wait(min(1.0, self._period()))
        return None

    def _hold(self) -> None:
        self.stopping.wait()

    def _period(self) -> float:
        periods = [
            float((c.spec.get("readinessProbe") or {}).get("periodSeconds", 1))
            for c in self.containers
        ]
        return min(periods or [1.0])

    def _phase(self) -> str:
        if any(c.exit_code not in (None, 0) for c in self.init) and not self._restart_allowed(1):
            return "Failed"
        if not all(c.exit_code == 0 for c in self.init):
            return "Pending"
        if any(c.process is None for c in self.containers):
            return "Pending"
        ended = [c.exit_code for c in self.containers]
        if all(code is not None for code in ended) and not self._restart_allowed(1):
            return "Succeeded" if all(code == 0 for code in ended) else "Failed"
        return "Running"

    def _report(self) -> None:
        initialized = all(c.exit_code == 0 for c in self.init)
        ready = initialized and all(c.ready for c in self.containers)

        def condition(kind: str, value: bool) -> Body:
            return {
                "type": kind,
                "status": "True" if value else "False",
                "lastTransitionTime": self.start_time,
            }

        status = {
            "phase": self._phase(),
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.start_time,
            "conditions": [
                condition("PodScheduled", True),
                condition("Initialized", initialized),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "initContainerStatuses": [c.status() for c in self.init],
            "containerStatuses": [c.status() for c in self.containers],
        }
        with self._lock:
            if status == getattr(self, "_reported", None):
                return
            try:
                self.node.rest.merge_patch(
                    "v1", "pods", self.name, {"status": status}, self.namespace, "status"
                )
                self._reported = status
            except (ApiError, OSError):
                pass  # the pod is gone or the API is down: the next round tries again

    def terminate(self, grace: float) -> None:
        """SIGTERM every process, SIGKILL what is left after `grace` seconds."""
        with self._launching:
            self.stopping.set()
            processes = [c.process for c in (*self.init, *self.containers) if c.process]
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._thread.join(timeout=10)

    def kill(self, container: str) -> None:
        """SIGKILL one container's process, as an out-of-memory kill would."""
        for entry in self.containers:
            if entry.name == container and entry.process and entry.process.poll() is None:
                os.killpg(entry.process.pid, signal.SIGKILL)

    def log(self, container: str) -> str:
        path = self.folder / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class ProcessKubelet:
    """The node: binds, runs and deletes pods, and keeps the Service table for the pods."""

    def __init__(self, plane: ControlPlane, folder: Path) -> None:
        self.plane = plane
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.rest = Rest(plane.url, plane.pki.ca, cert=(plane.pki.admin.cert, plane.pki.admin.key))
        self.services_file = folder / "services.json"
        self.services_file.write_text("{}", encoding="utf-8")
        self.pods: dict[str, PodRunner] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._terminating: set[str] = set()

    def start(self) -> ProcessKubelet:
        self._register()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for runner in list(self.pods.values()):
            runner.terminate(5)

    def _register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": NODE_LABELS},
        }
        try:
            self.rest.create("v1", "nodes", node)
        except ApiError as exc:
            if exc.status != 409:
                raise
        status = {
            "status": {
                "capacity": {"cpu": "64", "memory": "256Gi", "pods": "500"},
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "500"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "the process kubelet is running",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            }
        }
        self.rest.merge_patch("v1", "nodes", NODE, status, subresource="status")

    def _loop(self) -> None:
        while not self._stop.is_set():
            # The API server may be restarting: the next round tries again.
            with contextlib.suppress(ApiError, OSError):
                self._sync()
            self._stop.wait(0.25)

    def _sync(self) -> None:
        pods = self.rest.list("v1", "pods")
        seen = set()
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            uid = meta["uid"]
            seen.add(uid)
            if not spec.get("nodeName"):
                if self._fits(spec):
                    self._bind(pod)
                continue
            if spec["nodeName"] != NODE:
                continue
            runner = self.pods.get(uid)
            if meta.get("deletionTimestamp"):
                if uid not in self._terminating:
                    self._terminating.add(uid)
                    grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                    threading.Thread(target=self._delete, args=(pod, grace), daemon=True).start()
                continue
            if runner is None and (pod.get("status") or {}).get("phase") not in (
                "Succeeded",
                "Failed",
            ):
                runner = self.pods[uid] = PodRunner(self, pod)
                runner.start()
        for uid in set(self.pods) - seen:
            threading.Thread(target=self.pods.pop(uid).terminate, args=(0,), daemon=True).start()
        self._write_services(pods)

    @staticmethod
    def _fits(spec: Body) -> bool:
        """Whether the pod's nodeSelector matches this node (as the scheduler checks)."""
        return all(NODE_LABELS.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())

    def _bind(self, pod: Body) -> None:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        try:
            self.rest.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                binding,
            )
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def _delete(self, pod: Body, grace: float) -> None:
        meta = pod["metadata"]
        runner = self.pods.pop(meta["uid"], None)
        if runner is not None:
            runner.terminate(grace)
        try:
            self.rest.delete(
                "v1",
                "pods",
                meta["name"],
                meta["namespace"],
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )
        except (ApiError, OSError):
            self._terminating.discard(meta["uid"])  # tried again next round

    def _write_services(self, pods: list[Body]) -> None:
        table: dict[str, dict[str, int]] = {}
        for service in self.rest.list("v1", "services"):
            meta, spec = service["metadata"], service.get("spec") or {}
            selector = spec.get("selector") or {}
            if not selector:
                continue
            ready = [
                self.pods[p["metadata"]["uid"]]
                for p in pods
                if p["metadata"]["namespace"] == meta["namespace"]
                and p["metadata"]["uid"] in self.pods
                and all(
                    (p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items()
                )
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (p.get("status") or {}).get("conditions", [])
                )
            ]
            if not ready:
                continue
            ports: dict[str, int] = {}
            for port in spec.get("ports", []):
                target = port.get("targetPort", port["port"])
                runner = ready[0]
                host = (
                    runner.port_names.get(target)
                    if isinstance(target, str)
                    else runner.ports.get(int(target))
                )
                if host:
                    ports[str(port["port"])] = host
            for suffix in ("", ".svc", ".svc.cluster.local"):
                table[f"{meta['name']}.{meta['namespace']}{suffix}"] = ports
        text = json.dumps(table, sort_keys=True)
        if text != self.services_file.read_text(encoding="utf-8"):
            scratch = self.services_file.with_suffix(".tmp")
            scratch.write_text(text, encoding="utf-8")
            scratch.replace(self.services_file)

    # -- for the tests ------------------------------------------------------------------
    def runner(self, namespace: str, name: str) -> PodRunner | None:
        return next(
            (r for r in self.pods.values() if r.namespace == namespace and r.name == name), None
        )

    def runners(self, namespace: str) -> list[PodRunner]:
        return [r for r in self.pods.values() if r.namespace == namespace]

    def host_port(self, namespace: str, pod: str, port: str | int) -> int:
        runner = self.runner(namespace, pod)
        if runner is None:
            raise LookupError(f"pod {namespace}/{pod} is not running on this node")
        found = runner.port_names.get(port) if isinstance(port, str) else runner.ports.get(port)
        if found is None:
            raise LookupError(f"pod {namespace}/{pod} declares no port {port!r}")
        return found


def cleanup(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
