"""Applying children is create-or-patch, even when two handlers race to create them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
import pytest

from leasebox_operator import reconcile
from leasebox_operator.children import Pool
from leasebox_operator.models import PoolSpec

OWNER: dict[str, Any] = {
    "apiVersion": "leasebox.dev/v1alpha1",
    "kind": "OutboxWorkerPool",
    "metadata": {"name": "otp", "namespace": "mail", "uid": "uid-1"},
}


class RacingKube:
    """An in-memory API where another handler creates each child just before this one."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.created_by_us: list[str] = []
        self.patched: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        full = f"{path}/{name}"
        if full not in self.objects:
            self.objects[full] = dict(body)  # the other handler won the race
            return None
        self.created_by_us.append(full)
        return dict(body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.patched.append(path)
        return self.objects[path]

    async def serves(self, api_version: str, plural: str) -> bool:
        return False


async def test_a_child_created_meanwhile_is_adopted_instead_of_failing() -> None:
    pool = Pool(
        "mail",
        "otp",
        PoolSpec.model_validate({
            "kinds": ["otp"],
            "database": {"secretRef": {"name": "db"}},
            "provider": {"secretRef": {"name": "mail"}},
        }),
    )  # fmt: skip
    kube = RacingKube()

    applied = await reconcile.apply_children(kube, kopf.Body(OWNER), pool, "img:1")

    assert kube.created_by_us == []
    assert set(kube.objects) == {
        "/apis/apps/v1/namespaces/mail/deployments/otp-worker",
        "/apis/policy/v1/namespaces/mail/poddisruptionbudgets/otp-worker",
    }
    assert not any(action.startswith("created") for action in applied.actions)


async def test_a_child_that_vanishes_after_a_conflict_is_reported() -> None:
    class VanishingKube(RacingKube):
        async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
            return None

    pool = Pool("mail", "otp", PoolSpec.model_validate({
        "kinds": ["otp"], "database": {"secretRef": {"name": "db"}},
        "provider": {"secretRef": {"name": "mail"}},
    }))  # fmt: skip
    with pytest.raises(reconcile.ChildConflict, match="cannot be read"):
        await reconcile.apply_children(VanishingKube(), kopf.Body(OWNER), pool, "img:1")
