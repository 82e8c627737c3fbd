"""The official client (`kubernetes.aio`) works against the emulated API where the operator uses it.

Server-side apply with field managers (create, drift corrected, a removed field removed, a
field another manager owns kept, a conflict without force), the `/scale` subresource,
and custom objects, each through the client exactly as the operator calls it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client, config

from support.kube.emulator import KubeEmulator

APPLY = "application/apply-patch+yaml"
MANAGER = "leasebox-operator"


def deployment(image: str = "img:1", env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "worker", "image": image}
    if env is not None:
        container["env"] = env
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": "default", "labels": {"app": "w"}},
        "spec": {
            "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [container]}},
        },
    }


@pytest.fixture
async def apps(kube_emulator: KubeEmulator, tmp_path: Path) -> AsyncIterator[client.AppsV1Api]:
    configuration = client.Configuration()
    kubeconfig = kube_emulator.write_kubeconfig(tmp_path / "kubeconfig")
    await config.load_kube_config(str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    async with client.ApiClient(configuration) as api_client:
        yield client.AppsV1Api(api_client)


async def _apply(apps: client.AppsV1Api, body: dict[str, Any], *, force: bool = True) -> Any:
    return await apps.patch_namespaced_deployment(
        "w", "default", body, field_manager=MANAGER, force=force, _content_type=APPLY
    )


def _container(kube: KubeEmulator) -> dict[str, Any]:
    found = kube.get("apps/v1", "deployments", "w", "default")
    assert found is not None
    container: dict[str, Any] = found["spec"]["template"]["spec"]["containers"][0]
    return container


async def test_an_apply_creates_the_object_and_records_its_manager(
    apps: client.AppsV1Api, kube_emulator: KubeEmulator
) -> None:
    created = await _apply(apps, deployment())
    assert created.metadata.uid
    stored = kube_emulator.get("apps/v1", "deployments", "w", "default")
    assert stored is not None
    managers = {(m["manager"], m["operation"]) for m in stored["metadata"]["managedFields"]}
    assert managers == {(MANAGER, "Apply")}
    assert stored["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:template"]


async def test_a_second_apply_corrects_drift_made_by_hand(
    apps: client.AppsV1Api, kube_emulator: KubeEmulator
) -> None:
    await _apply(apps, deployment())
    template = {"template": {"spec": {"containers": [{"name": "worker", "image": "evil:1"}]}}}
    kube_emulator.patch("apps/v1", "deployments", "w", {"spec": template}, "default")
    assert _container(kube_emulator)["image"] == "evil:1"

    await _apply(apps, deployment())

    assert _container(kube_emulator)["image"] == "img:1"


async def test_a_conflicting_apply_without_force_is_refused(
    apps: client.AppsV1Api, kube_emulator: KubeEmulator
) -> None:
    await _apply(apps, deployment())
    template = {"template": {"spec": {"containers": [{"name": "worker", "image": "evil:1"}]}}}
    kube_emulator.patch("apps/v1", "deployments", "w", {"spec": template}, "default")

    with pytest.raises(client.ApiException) as caught:
        await _apply(apps, deployment(), force=False)

    assert caught.value.status == 409
    assert "image" in str(caught.value.body)


async def test_a_field_left_out_of_the_next_apply_is_removed_but_others_fields_stay(
    apps: client.AppsV1Api, kube_emulator: KubeEmulator
) -> None:
    await _apply(apps, deployment(env=[{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]))
    await apps.patch_namespaced_deployment_scale(
        "w", "default", {"spec": {"replicas": 4}}, field_manager="hpa"
    )

    await _apply(apps, deployment(env=[{"name": "A", "value": "1"}]))

    assert _container(kube_emulator)["env"] == [{"name": "A", "value": "1"}]
    stored = kube_emulator.get("apps/v1", "deployments", "w", "default")
    assert stored is not None
    assert stored["spec"]["replicas"] == 4  # the scaler's field, not the applier's


async def test_an_unchanged_apply_writes_nothing(
    apps: client.AppsV1Api, kube_emulator: KubeEmulator
) -> None:
    first = await _apply(apps, deployment())
    second = await _apply(apps, deployment())
    assert second.metadata.resource_version == first.metadata.resource_version


async def test_replicas_change_through_the_scale_subresource(
    apps: client.AppsV1Api, kube_emulator: KubeEmulator
) -> None:
    body: Any = {**deployment(), "spec": {**deployment()["spec"], "replicas": 2}}
    await apps.create_namespaced_deployment("default", body, field_manager=MANAGER)

    scale = await apps.patch_namespaced_deployment_scale(
        "w", "default", {"spec": {"replicas": 6}}, field_manager=MANAGER
    )
    read = await apps.read_namespaced_deployment_scale("w", "default")

    assert scale.spec is not None
    assert read.spec is not None
    assert read.status is not None
    assert scale.spec.replicas == read.spec.replicas == 6
    assert read.status.selector == "app=w"
