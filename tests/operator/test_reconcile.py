"""Applying children: created once, applied afterwards, replicas only put back in bounds.

The fake implements `reconcile.ChildrenApi`, the port the official client implements, so
mypy checks that the fake and the real one agree.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from leasebox_operator import reconcile
from leasebox_operator.children import Pool
from leasebox_operator.errors import ChildConflict, FieldConflict, InvalidSpec, SecretError
from leasebox_operator.models import PoolSpec

OWNER: dict[str, Any] = {
    "apiVersion": "leasebox.dev/v1alpha1",
    "kind": "OutboxWorkerPool",
    "metadata": {"name": "otp", "namespace": "mail", "uid": "uid-1"},
}
BASE: dict[str, Any] = {
    "kinds": ["otp"],
    "database": {"secretRef": {"name": "db"}},
    "provider": {"secretRef": {"name": "mail"}},
}


def _pool(**spec: Any) -> Pool:
    return Pool("mail", "otp", PoolSpec.model_validate(BASE | spec))


class FakeApi:
    """Children in memory, keyed by (kind, name); implements `reconcile.ChildrenApi`."""

    def __init__(self, *, serves_monitoring: bool = False) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self.serves_monitoring = serves_monitoring
        self.secrets: dict[str, frozenset[str]] = {"db": frozenset({"dsn"}),
                                                  "mail": frozenset({"url"})}  # fmt: skip
        self.version = 0
        # The field manager that changed the Deployment's image since it was applied.
        self.image_changed_by: str | None = None

    def _store(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(dict(manifest))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.objects[(stored["kind"], stored["metadata"]["name"])] = stored
        return copy.deepcopy(stored)

    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((kind, name))
        return None if found is None else copy.deepcopy(found)

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        self.calls.append(f"create {manifest['kind']}")
        if (manifest["kind"], manifest["metadata"]["name"]) in self.objects:
            return None
        return self._store(manifest)

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = False) -> dict[str, Any]:
        self.calls.append(f"apply {manifest['kind']}" + (" forced" if force else ""))
        key = (manifest["kind"], manifest["metadata"]["name"])
        before = self.objects[key]
        if manifest["kind"] == "Deployment" and self.image_changed_by:
            manager = self.image_changed_by
            if not force:
                field = ".spec.template.spec.containers[name=worker].image"
                raise FieldConflict(f"Deployment otp-worker: {field}", ((field, manager),))
            self.image_changed_by = None
            entries = before["metadata"].get("managedFields", [])
            before["metadata"]["managedFields"] = [e for e in entries if e["manager"] != manager]
        merged = copy.deepcopy(dict(manifest))
        if "replicas" in before.get("spec", {}):
            merged["spec"]["replicas"] = before["spec"]["replicas"]
        unchanged = {**merged, "metadata": {**merged["metadata"], "resourceVersion": None}} == {
            **before, "metadata": {**before["metadata"], "resourceVersion": None}}  # fmt: skip
        return copy.deepcopy(before) if unchanged else self._store(merged)

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        self.calls.append(f"delete {kind}")
        return self.objects.pop((kind, name), None) is not None

    async def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        self.calls.append(f"scale {replicas}")
        self.objects[("Deployment", deployment)]["spec"]["replicas"] = replicas

    async def serves(self, api_version: str, plural: str) -> bool:
        return self.serves_monitoring

    async def secret_keys(self, namespace: str, name: str) -> frozenset[str]:
        if name not in self.secrets:
            raise SecretError(f"Secret {namespace}/{name} does not exist")
        return self.secrets[name]

    def change_image(self, manager: str, operation: str) -> None:
        """Another field manager sets the worker image (by `Update` or by `Apply`)."""
        deployment = self.objects[("Deployment", "otp-worker")]
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
        entry = {"manager": manager, "operation": operation}
        deployment["metadata"].setdefault("managedFields", []).append(entry)
        self.image_changed_by = manager


def _typed(api: FakeApi) -> reconcile.ChildrenApi:
    return api  # mypy checks here that the fake implements the port


async def test_a_new_pool_gets_its_deployment_created_at_min_replicas_then_applied() -> None:
    api = FakeApi()
    first = await reconcile.apply_children(api, OWNER, _pool(scaling={"minReplicas": 2}), "img:1")
    assert api.calls == ["create Deployment", "create PodDisruptionBudget"]
    assert first.actions == [
        "created Deployment otp-worker",
        "created PodDisruptionBudget otp-worker",
    ]
    assert api.objects[("Deployment", "otp-worker")]["spec"]["replicas"] == 2
    owner_refs = api.objects[("Deployment", "otp-worker")]["metadata"]["ownerReferences"]
    assert owner_refs[0]["uid"] == "uid-1"

    api.calls.clear()
    again = await reconcile.apply_children(api, OWNER, _pool(scaling={"minReplicas": 2}), "img:1")
    assert api.calls == ["apply Deployment", "apply PodDisruptionBudget"]
    assert not again.changed  # an unchanged apply changes nothing


async def test_an_apply_never_carries_the_replicas_and_bounds_are_kept_through_scale() -> None:
    api = FakeApi()
    await reconcile.apply_children(api, OWNER, _pool(), "img:1")
    api.objects[("Deployment", "otp-worker")]["spec"]["replicas"] = 30  # scaled meanwhile
    applied = await reconcile.apply_children(api, OWNER, _pool(scaling={"maxReplicas": 8}), "img:2")
    assert "scale 8" in api.calls
    assert "rescaled Deployment otp-worker 30→8" in applied.actions
    assert "updated Deployment otp-worker" in applied.actions


async def test_a_child_created_meanwhile_is_applied_instead_of_failing() -> None:
    class RacingApi(FakeApi):
        async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
            self._store(manifest)  # the other handler won the race
            return None

    api = RacingApi()
    applied = await reconcile.apply_children(api, OWNER, _pool(), "img:1")
    assert api.calls[0] == "apply Deployment"  # the racing create put it there
    assert not any(action.startswith("created") for action in applied.actions)
    assert set(api.objects) == {("Deployment", "otp-worker"), ("PodDisruptionBudget", "otp-worker")}


async def test_a_child_that_vanishes_after_a_conflict_is_reported() -> None:
    class VanishingApi(FakeApi):
        async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
            return None

    with pytest.raises(ChildConflict, match="cannot be read"):
        await reconcile.apply_children(VanishingApi(), OWNER, _pool(), "img:1")


async def test_a_strangers_object_of_the_same_name_is_never_taken_over() -> None:
    api = FakeApi()
    api.objects[("Deployment", "otp-worker")] = {
        "kind": "Deployment", "metadata": {"name": "otp-worker", "ownerReferences": []},
        "spec": {"replicas": 3},
    }  # fmt: skip
    with pytest.raises(ChildConflict, match="not owned by this pool") as caught:
        await reconcile.apply_children(api, OWNER, _pool(), "img:1")
    assert caught.value.reason == "ChildConflict"
    assert not any(call.startswith("apply") for call in api.calls)


async def test_monitoring_objects_need_their_crds_and_go_when_turned_off() -> None:
    monitoring = {"podMonitor": True, "prometheusRule": True}
    missing = await reconcile.apply_children(FakeApi(), OWNER, _pool(monitoring=monitoring), "i")
    assert len(missing.warnings) == 2
    assert "install the Prometheus Operator CRDs" in missing.warnings[0]
    api = FakeApi(serves_monitoring=True)
    await reconcile.apply_children(api, OWNER, _pool(monitoring=monitoring), "i")
    assert {kind for kind, _ in api.objects} >= {"PodMonitor", "PrometheusRule"}
    off = await reconcile.apply_children(api, OWNER, _pool(), "i")
    assert "deleted PodMonitor otp-worker" in off.actions
    assert {kind for kind, _ in api.objects} == {"Deployment", "PodDisruptionBudget"}


async def test_a_missing_secret_key_is_named() -> None:
    api = FakeApi()
    api.secrets["db"] = frozenset({"url"})
    with pytest.raises(SecretError, match="Secret mail/db has no key 'dsn'") as caught:
        await reconcile.check_secrets(_typed(api), _pool())
    assert caught.value.reason == "SecretKeyMissing"


def test_a_name_too_long_for_the_deployment_is_an_invalid_spec() -> None:
    body = {**OWNER, "metadata": {"name": "x" * 57, "namespace": "mail"}, "spec": BASE}
    with pytest.raises(InvalidSpec, match="at most 56 characters"):
        reconcile.parse_pool(body)


async def test_an_image_changed_by_an_imperative_edit_is_taken_back() -> None:
    api = FakeApi()
    await reconcile.apply_children(api, OWNER, _pool(), "img:1")
    api.change_image("kubectl-set", "Update")
    api.calls.clear()
    applied = await reconcile.apply_children(api, OWNER, _pool(), "img:1")
    assert api.calls[:2] == ["apply Deployment", "apply Deployment forced"]
    assert "took back Deployment otp-worker fields edited by ['kubectl-set']" in applied.actions
    deployment = api.objects[("Deployment", "otp-worker")]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"


async def test_an_image_another_manager_applies_is_reported_and_not_forced() -> None:
    api = FakeApi()
    await reconcile.apply_children(api, OWNER, _pool(), "img:1")
    api.change_image("gitops", "Apply")
    api.calls.clear()
    with pytest.raises(FieldConflict) as conflict:
        await reconcile.apply_children(api, OWNER, _pool(), "img:1")
    assert api.calls == ["apply Deployment"]
    assert conflict.value.reason == "FieldConflict"
    assert conflict.value.fields == (
        (".spec.template.spec.containers[name=worker].image", "gitops"),
    )
    assert "another manager applies these fields too" in conflict.value.message
    deployment = api.objects[("Deployment", "otp-worker")]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "other:1"
