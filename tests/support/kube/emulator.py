"""The test suite's Kubernetes API: a started emulated server, direct access, a fixture.

No real API server can run in the test environment, so kopf and API clients are tested
end to end against one served from memory (`kube_api_server.EmulatedKubeAPI`, built on
kmock's `KubernetesEmulator`). It fills what kmock 0.8 lacks for kopf and clients:

* server-owned metadata: `uid`, a cluster-wide `resourceVersion`, `creationTimestamp`,
  `generation` (bumped when anything but metadata and status changes), `generateName`;
* status codes: 201 on create, 404 on a missing object, namespace or unserved resource,
  409 on an existing name or a stale `resourceVersion`, 422 on a failed JSON-patch `test`;
* merge-patch, JSON-patch, strategic-merge-patch (treated as merge-patch) and PUT;
* real `/status` and `/scale` subresources: status writes touch nothing else, and writes
  to the main endpoint keep the stored status when the resource has a status subresource;
* `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists) and `fieldSelector`
  (`=`, `==`, `!=` on dotted paths);
* watches from a `resourceVersion` (only later events), `sendInitialEvents` with its
  closing bookmark, `timeoutSeconds`, and ADDED/DELETED as objects enter or leave a
  selector; `GET /api/v1/namespaces`; `/version/`, `/api/` and `/apis/`;
* discovery of a fixed set of built-ins and of every CRD created through the API;
* what a cluster does by itself: background ownerReference garbage collection,
  finalizers that hold a deleted object until a patch removes them, and a tiny Deployment
  controller whose status follows `spec.replicas` (readiness after a settable delay, or
  frozen).

`KubeEmulator` is a facade rather than a kmock subclass because kmock's handler already
owns `url`, `get`, `patch` and `delete` as HTTP-client shortcuts with other meanings. It
serves from its own thread and event loop, so synchronous tests, subprocesses and
`kopf.testing.KopfRunner` can all reach it, and it reads and writes objects directly.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import kmock
import pytest

from support.kube.server import EVENTS, EmulatedKubeAPI

__all__ = ["EmulatedKubeAPI", "KubeEmulator", "kube_emulator"]

Bodies = list[dict[str, Any]]


_CRDS = kmock.resource(
    group="apiextensions.k8s.io", version="v1", plural="customresourcedefinitions"
)


def _resource_of(api_version: str, plural: str) -> kmock.resource:
    group, _, version = api_version.rpartition("/")
    return kmock.resource(group=group, version=version, plural=plural)


class KubeEmulator:
    """A started emulated API server with direct, thread-safe object access for tests.

    Errors of the direct methods are the API's: `kmock.KubernetesError` with `status`
    404 (missing), 409 (exists or stale), 422 (invalid), as a client would see them.
    """

    def __init__(self) -> None:
        self.api = EmulatedKubeAPI()
        self.url = ""
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self._failure: BaseException | None = None

    @property
    def deployment_ready_delay(self) -> float:
        return self.api.deployment_ready_delay

    @deployment_ready_delay.setter
    def deployment_ready_delay(self, seconds: float) -> None:
        self.api.deployment_ready_delay = seconds

    @property
    def freeze_deployments(self) -> bool:
        return self.api.freeze_deployments

    @freeze_deployments.setter
    def freeze_deployments(self, frozen: bool) -> None:
        self.api.freeze_deployments = frozen

    def start(self) -> KubeEmulator:
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise RuntimeError("the emulated API server did not start") from self._failure
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()
        if self._failure is not None:
            raise RuntimeError("the emulated API server failed") from self._failure

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._failure = exc
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        async with self.api, kmock.Server(self.api) as server:
            self.url = f"http://{server.host}:{server.port}"
            self._ready.set()
            await self._stopping.wait()
            self.api.close_watches()  # or the server waits for open watches before it closes

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """Write a kubeconfig (no auth, plain http) that kopf and kubectl-like clients accept."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "preferences": {},
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {
                        "cluster": "emulator",
                        "user": "emulator",
                        "namespace": namespace,
                    },
                }
            ],
        }
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is valid YAML
        return path

    def get(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return self.api.get_object(_resource_of(api_version, plural), namespace, name)
        except kmock.KubernetesError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, plural: str, namespace: str | None = None) -> Bodies:
        return self.api.list_objects(_resource_of(api_version, plural), namespace)

    def create(
        self, api_version: str, plural: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        return self.api.create_object(_resource_of(api_version, plural), namespace, body)

    def patch(
        self,
        api_version: str,
        plural: str,
        name: str,
        patch: dict[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        resource = _resource_of(api_version, plural)
        return self.api.update_object(
            resource, namespace, name, patch, "application/merge-patch+json", subresource
        )

    def delete(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> None:
        self.api.delete_object(_resource_of(api_version, plural), namespace, name)

    def apply_crd(self, crd: dict[str, Any]) -> None:
        """Register a CRD, as creating it through the API does (or replacing it, if it exists)."""
        name = crd["metadata"]["name"]
        if self.get("apiextensions.k8s.io/v1", "customresourcedefinitions", name) is None:
            self.create("apiextensions.k8s.io/v1", "customresourcedefinitions", crd)
        else:
            self.api.update_object(_CRDS, None, name, crd, "replace")

    def events(self, namespace: str | None = None) -> Bodies:
        """Events posted by clients, core/v1 and events.k8s.io/v1 alike."""
        return [obj for res in EVENTS for obj in self.api.list_objects(res, namespace)]


@pytest.fixture
def kube_emulator() -> Iterator[KubeEmulator]:
    """A started emulated API server (namespace "default" exists); fails on emulator bugs."""
    with KubeEmulator() as emulator:
        yield emulator
    if emulator.api.server_errors:
        errors = "; ".join(repr(exc) for exc in emulator.api.server_errors)
        pytest.fail(f"the emulated API server failed internally: {errors}")
