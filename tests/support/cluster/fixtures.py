"""Fixtures of the cluster tier: one real control plane and one process node per session.

The control plane starts once per test session (it takes seconds) in the build folder;
each test gets a namespace of its own, deleted after it. Where Go is missing the tier
skips with one line saying how to get it; under `CI` it fails instead, as the database
tests do.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster.controlplane import (
    ROOT,
    ControlPlane,
    ControlPlaneUnavailable,
    start_control_plane,
)
from support.cluster.kubelet import ProcessKubelet, cleanup
from support.cluster.rest import Rest
from support.pace import record_start_up

BUILD = ROOT / "build"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    folder = BUILD / f"cluster-{os.getpid()}"
    cleanup(folder)
    try:
        plane = start_control_plane(folder)
    except ControlPlaneUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the cluster tests are required under CI: {exc}")
        pytest.skip(str(exc))
    record_start_up("the control plane", plane.start_seconds)
    yield plane
    plane.stop()
    cleanup(folder)


@pytest.fixture(scope="session")
def kubelet(control_plane: ControlPlane) -> Iterator[ProcessKubelet]:
    node = ProcessKubelet(control_plane, control_plane.folder / "node").start()
    yield node
    node.stop()


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Rest:
    """The cluster as its administrator sees it."""
    pki = control_plane.pki
    return Rest(control_plane.url, pki.ca, cert=(pki.admin.cert, pki.admin.key))


@pytest.fixture
def namespace(kube: Rest, control_plane: ControlPlane) -> Iterator[str]:
    """A namespace of this test's own, deleted (with everything in it) afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.create(
        "v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    kube.delete("v1", "namespaces", name)


def kubeconfig_for(plane: ControlPlane, folder: Path, namespace: str, account: str) -> Path:
    """A kubeconfig holding a TokenRequest token of `namespace/account`."""
    return plane.write_kubeconfig(
        folder / f"{account}.kubeconfig", token=plane.token(namespace, account), namespace=namespace
    )
