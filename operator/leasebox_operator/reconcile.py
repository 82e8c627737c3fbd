"""Reconciling a pool's children: create what is missing, patch what changed.

The manifests come from `children` (pure); this module compares them with what the
cluster holds and sends the difference. A child is patched only when the hash of its
manifest changed, so an unchanged spec costs reads and no writes, and a changed pod
template rolls the workers out. The replica count is the poll loop's: a reconcile sets
it only on creation and when a new min/max puts it out of bounds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from leasebox_operator import children
from leasebox_operator.children import HASH_ANNOTATION, MAX_NAME_LENGTH, Pool
from leasebox_operator.kube import Kube, SecretError, resource_path
from leasebox_operator.models import PoolSpec

MONITORING = "monitoring.coreos.com/v1"


class InvalidSpec(Exception):
    """The spec does not validate; `message` names fields and problems, never values."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ChildConflict(Exception):
    """A child's name is taken by an object this pool does not own."""


def describe(exc: ValidationError) -> str:
    """`spec.scaling: minReplicas must not exceed maxReplicas; ...` without input values."""
    parts = []
    for error in exc.errors():
        where = ".".join(["spec", *(str(p) for p in error["loc"])])
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def parse_pool(body: Mapping[str, Any]) -> Pool:
    """The pool of a resource body, or `InvalidSpec`."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidSpec(
            f"metadata.name: at most {MAX_NAME_LENGTH} characters (it names "
            "the worker Deployment and labels its pods)"
        )
    raw = json.loads(json.dumps(body.get("spec") or {}))
    try:
        spec = PoolSpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidSpec(describe(exc)) from None
    return Pool(namespace=namespace, name=name, spec=spec)


async def check_secrets(kube: Kube, pool: Pool) -> None:
    """Every referenced Secret key exists (values are not read); else `SecretError`."""
    refs = [pool.spec.database.secret_ref, pool.spec.provider.secret_ref]
    if pool.spec.worker.payload_keys_secret_ref:
        refs.append(pool.spec.worker.payload_keys_secret_ref)
    for ref in refs:
        if ref.key not in await kube.secret_keys(pool.namespace, ref.name):
            raise SecretError(
                "SecretKeyMissing", f"Secret {pool.namespace}/{ref.name} has no key {ref.key!r}"
            )


@dataclass
class Applied:
    """What one reconcile did."""

    deployment: str
    actions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.actions)

    def summary(self) -> str:
        return "; ".join(self.actions)

    def ready_message(self) -> str:
        return f"worker Deployment {self.deployment} and its PodDisruptionBudget are applied"


def _owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = (owner.get("metadata") or {}).get("uid")
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def _hash_of(obj: Mapping[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(HASH_ANNOTATION)
    return str(value) if value is not None else None


async def _ensure(
    kube: Kube,
    owner: kopf.Body,
    manifest: dict[str, Any],
    plural: str,
    existing: dict[str, Any] | None,
    applied: Applied,
) -> None:
    """Create the child, or patch it when its manifest hash changed."""
    kopf.adopt(manifest, owner=owner)
    meta = manifest["metadata"]
    api_version, kind, name = manifest["apiVersion"], manifest["kind"], meta["name"]
    if existing is None:
        collection = resource_path(api_version, plural, meta["namespace"])
        if await kube.create(collection, manifest) is not None:
            applied.actions.append(f"created {kind} {name}")
            return
        # Created meanwhile (the create handler and the poll loop both apply children).
        existing = await kube.get(resource_path(api_version, plural, meta["namespace"], name))
        if existing is None:
            raise ChildConflict(f"{kind} {name} was reported to exist but cannot be read")
    if not _owned_by(existing, owner):
        raise ChildConflict(f"{kind} {name} exists and is not owned by this pool")
    spec = dict(manifest["spec"])
    existing_replicas = (existing.get("spec") or {}).get("replicas")
    if "replicas" in spec and spec["replicas"] == existing_replicas:
        del spec["replicas"]  # the poll loop owns it; do not race it with a stale copy
    if _hash_of(existing) == _hash_of(manifest) and "replicas" not in spec:
        return
    if kind == "Deployment":
        pod = spec["template"]["spec"]
        pod.setdefault("serviceAccountName", None)  # a removed account is removed
    patch = {
        "metadata": {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta},
        "spec": spec,
    }
    await kube.merge_patch(resource_path(api_version, plural, meta["namespace"], name), patch)
    what = "rolled out" if _hash_of(existing) != _hash_of(manifest) else "rescaled"
    applied.actions.append(f"{what} {kind} {name}")


async def _monitoring(kube: Kube, owner: kopf.Body, pool: Pool, applied: Applied) -> None:
    wanted = (
        (pool.spec.monitoring.pod_monitor, children.pod_monitor(pool), "podmonitors"),
        (pool.spec.monitoring.prometheus_rule, children.prometheus_rule(pool), "prometheusrules"),
    )
    for enabled, manifest, plural in wanted:
        served = await kube.serves(MONITORING, plural)
        path = resource_path(MONITORING, plural, pool.namespace, manifest["metadata"]["name"])
        if enabled and not served:
            applied.warnings.append(
                f"{manifest['kind']} requested but the cluster does not serve {MONITORING} "
                f"{plural}; install the Prometheus Operator CRDs"
            )
        elif enabled:
            await _ensure(kube, owner, manifest, plural, await kube.get(path), applied)
        elif served:
            existing = await kube.get(path)
            if existing is not None and _owned_by(existing, owner) and await kube.delete(path):
                applied.actions.append(f"deleted {manifest['kind']} {manifest['metadata']['name']}")


async def apply_children(kube: Kube, owner: kopf.Body, pool: Pool, image: str) -> Applied:
    """Create or patch the Deployment, the PodDisruptionBudget and the monitoring objects."""
    applied = Applied(deployment=pool.deployment_name)
    path = resource_path("apps/v1", "deployments", pool.namespace, pool.deployment_name)
    existing = await kube.get(path)
    current = None if existing is None else int((existing.get("spec") or {}).get("replicas") or 0)
    replicas = (
        current
        if (current is not None and pool.spec.paused)
        else (children.clamp_replicas(current, pool))
    )
    manifest = children.deployment(pool, image=image, replicas=replicas)
    await _ensure(kube, owner, manifest, "deployments", existing, applied)
    pdb = children.pod_disruption_budget(pool)
    pdb_path = resource_path(
        "policy/v1", "poddisruptionbudgets", pool.namespace, pdb["metadata"]["name"]
    )
    await _ensure(kube, owner, pdb, "poddisruptionbudgets", await kube.get(pdb_path), applied)
    await _monitoring(kube, owner, pool, applied)
    return applied
