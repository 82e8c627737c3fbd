"""A tiny kopf operator works against the emulated API server end to end.

It sees a custom resource created in the emulator, writes its status, creates an adopted
ConfigMap child and posts an Event; deleting the resource runs the operator's deletion
handler (through kopf's finalizer), and the garbage collector then removes the child.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from kopf.testing import KopfRunner

from support.kube.emulator import KubeEmulator

Body = dict[str, Any]
WIDGET_CRD: Body = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}}
        ],
    },
}


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll a condition that the operator, running on its own thread, makes true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not become true in time")
        time.sleep(0.02)


def _widget_operator(api_url: str) -> kopf.OperatorRegistry:
    """Reconcile a Widget: an adopted ConfigMap child and `status.phase`."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.create("example.com", "v1", "widgets", id="create_widget", registry=registry)
    async def create(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        child = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{body.meta.name}-child"},
        }
        kopf.adopt(child, owner=body)
        async with (
            aiohttp.ClientSession(api_url) as session,
            session.post("/api/v1/namespaces/default/configmaps", json=child) as rsp,
        ):
            rsp.raise_for_status()
        patch.status["phase"] = "Ready"
        kopf.info(body, reason="Reconciled", message="the child exists")

    @kopf.on.delete("example.com", "v1", "widgets", registry=registry)
    def delete(**_: Any) -> None:
        pass

    return registry


def test_a_kopf_operator_reconciles_a_custom_resource_and_its_child_is_collected(
    kube_emulator: KubeEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube_emulator.apply_crd(WIDGET_CRD)
    monkeypatch.setenv("KUBECONFIG", str(kube_emulator.write_kubeconfig(tmp_path / "config")))
    previous_registry = kopf.get_default_registry()

    def widget() -> Body | None:
        return kube_emulator.get("example.com/v1", "widgets", "w", "default")

    def child() -> Body | None:
        return kube_emulator.get("v1", "configmaps", "w-child", "default")

    args = ["run", "--standalone", "--namespace", "default", "--verbose"]
    try:
        registry = _widget_operator(kube_emulator.url)
        with KopfRunner(args, registry=registry, timeout=60) as runner:
            kube_emulator.create(
                "example.com/v1", "widgets", {"metadata": {"name": "w"}}, "default"
            )
            wait_until(lambda: (widget() or {}).get("status", {}).get("phase") == "Ready")
            owner, adopted = widget(), child()
            assert owner is not None
            assert adopted is not None
            owner_uids = [ref["uid"] for ref in adopted["metadata"]["ownerReferences"]]
            assert owner_uids == [owner["metadata"]["uid"]]
            assert owner["metadata"]["finalizers"]  # kopf's, for its deletion handler
            wait_until(lambda: [e["reason"] for e in kube_emulator.events()] == ["Reconciled"])
            kube_emulator.delete("example.com/v1", "widgets", "w", "default")
            wait_until(lambda: widget() is None and child() is None)
    finally:
        kopf.set_default_registry(previous_registry)
    assert runner.exit_code == 0
    assert runner.exception is None
    assert "Handler 'create_widget' succeeded" in runner.output
