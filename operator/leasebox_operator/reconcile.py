"""Reconciling a pool's children: create what is missing, apply the rest, fix the replicas.

The manifests come from `children` (pure); this module sends them through a small port,
`ChildrenApi`, that the official client implements (`kube.Kube`) and the tests fake. A
child is created once (its creator then owns `spec.replicas`) and afterwards *applied*
with server-side apply, which changes nothing when nothing changed and leaves alone the
fields others own, above all the replicas that the poll loop, an HPA or `kubectl scale` set
through `/scale`. A reconcile touches replicas only when a new min/max puts them out of
bounds.

A field the operator sets that someone else changed is a conflict, settled by how they
changed it. An imperative edit (`kubectl edit`, `kubectl set image`: an *Update*) is drift,
taken back. Another *applier* (a GitOps tool applying the Deployment) declares an intent of
its own: forcing would make the two take the field from each other on every resync, so the
operator reports the conflict (`FieldConflict`: the fields and the manager) and leaves the
child as it is until one of them gives the field up.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import kopf
from pydantic import ValidationError

from leasebox_operator import alerts, children
from leasebox_operator.children import Pool
from leasebox_operator.errors import ChildConflict, FieldConflict, InvalidSpec, SecretError
from leasebox_operator.models import POOL_RULES, PoolSpec


class ChildrenApi(Protocol):
    """What reconciling needs from the Kubernetes API (children as plain dicts)."""

    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def apply(
        self, manifest: Mapping[str, Any], *, force: bool = False
    ) -> dict[str, Any]: ...

    async def delete(self, kind: str, namespace: str, name: str) -> bool: ...

    async def scale(self, namespace: str, deployment: str, replicas: int) -> None: ...

    async def serves(self, api_version: str, plural: str) -> bool: ...

    async def secret_keys(self, namespace: str, name: str) -> frozenset[str]: ...


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
    for rule in POOL_RULES:
        if not rule.check(body):
            raise InvalidSpec(rule.message)
    raw = json.loads(json.dumps(body.get("spec") or {}))
    try:
        spec = PoolSpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidSpec(describe(exc)) from None
    return Pool(namespace=namespace, name=name, spec=spec)


class PoolParser:
    """`parse_pool` once per generation of a live body.

    A poll loop reads its pool's spec on every poll from the body kopf keeps current, and
    the spec changes only with the generation; a spec the models reject is parsed again
    each time (its loop waits seconds between tries).
    """

    def __init__(self) -> None:
        self._parsed: tuple[int, Pool] | None = None

    def __call__(self, body: Mapping[str, Any]) -> Pool:
        generation = (body.get("metadata") or {}).get("generation")
        if generation is not None and self._parsed and self._parsed[0] == generation:
            return self._parsed[1]
        pool = parse_pool(body)
        self._parsed = None if generation is None else (int(generation), pool)
        return pool


async def check_secrets(kube: ChildrenApi, pool: Pool) -> None:
    """Every referenced Secret key exists (values are not read); else `SecretError`."""
    refs = [pool.spec.database.secret_ref, pool.spec.provider.secret_ref]
    if pool.spec.worker.payload_keys_secret_ref:
        refs.append(pool.spec.worker.payload_keys_secret_ref)
    for ref in refs:
        if ref.key not in await kube.secret_keys(pool.namespace, ref.name):
            raise SecretError(
                f"Secret {pool.namespace}/{ref.name} has no key {ref.key!r}", "SecretKeyMissing"
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


def _owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = (owner.get("metadata") or {}).get("uid")
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def _appliers(obj: Mapping[str, Any]) -> set[str]:
    """The field managers of `obj` that hold fields by server-side apply."""
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    return {str(e.get("manager")) for e in entries if e.get("operation") == "Apply"}


def _version(obj: Mapping[str, Any] | None) -> str | None:
    return None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")


def initial_replicas(pool: Pool) -> int:
    """Replicas of a new worker Deployment: minReplicas, or spec.replicas in mode External;
    none for a paused pool."""
    if pool.spec.paused:
        return 0
    wanted = pool.spec.replicas if pool.spec.scaling.mode == "External" else None
    return children.clamp_replicas(wanted, pool)


async def _apply_child(
    kube: ChildrenApi, owner: Mapping[str, Any], manifest: dict[str, Any], applied: Applied
) -> dict[str, Any]:
    """Create the child if missing (with `create`), else apply it; refuse a stranger's."""
    kopf.adopt(manifest, owner=kopf.Body(cast(Any, dict(owner))))
    kind, meta = manifest["kind"], manifest["metadata"]
    existing = await kube.read(kind, meta["namespace"], meta["name"])
    if existing is None:
        created = await kube.create(manifest)
        if created is not None:
            applied.actions.append(f"created {kind} {meta['name']}")
            return created
        # Created meanwhile (the create handler and the poll loop both apply children).
        existing = await kube.read(kind, meta["namespace"], meta["name"])
        if existing is None:
            raise ChildConflict(f"{kind} {meta['name']} was reported to exist but cannot be read")
    if not _owned_by(existing, owner):
        raise ChildConflict(f"{kind} {meta['name']} exists and is not owned by this pool")
    without_replicas = json.loads(json.dumps(manifest))
    (without_replicas.get("spec") or {}).pop("replicas", None)  # the scaler's field
    try:
        result = await kube.apply(without_replicas)
    except FieldConflict as conflict:
        appliers = _appliers(existing)
        if any(manager in appliers for _, manager in conflict.fields):
            raise FieldConflict(
                f"{conflict.message}; another manager applies these fields too, so the "
                "operator leaves them: remove them from that manager's manifest",
                conflict.fields,
            ) from None
        result = await kube.apply(without_replicas, force=True)
        managers = sorted({manager for _, manager in conflict.fields})
        applied.actions.append(f"took back {kind} {meta['name']} fields edited by {managers}")
        return result
    if _version(result) != _version(existing):
        applied.actions.append(f"updated {kind} {meta['name']}")
    return result


async def _monitoring(
    kube: ChildrenApi, owner: Mapping[str, Any], pool: Pool, runbooks: str, applied: Applied
) -> None:
    """Apply the monitoring objects asked for, delete those no longer asked for; a manifest
    is built only when it is applied (the PrometheusRule's is the costly one)."""
    monitoring = pool.spec.monitoring
    wanted: tuple[tuple[bool, str, Callable[[], dict[str, Any]]], ...] = (
        (monitoring.pod_monitor, "PodMonitor", lambda: children.pod_monitor(pool)),
        (
            monitoring.prometheus_rule,
            "PrometheusRule",
            lambda: children.prometheus_rule(pool, runbooks),
        ),
    )
    name = pool.deployment_name  # both objects are named after the workers
    for enabled, kind, build in wanted:
        api_version, plural = children.CHILD_RESOURCES[kind]
        served = await kube.serves(api_version, plural)
        if enabled and not served:
            applied.warnings.append(
                f"{kind} requested but the cluster does not serve {api_version} {plural}; "
                "install the Prometheus Operator CRDs"
            )
        elif enabled:
            await _apply_child(kube, owner, build(), applied)
        elif served:
            existing = await kube.read(kind, pool.namespace, name)
            if (
                existing is not None
                and _owned_by(existing, owner)
                and await kube.delete(kind, pool.namespace, name)
            ):
                applied.actions.append(f"deleted {kind} {name}")


async def apply_children(
    kube: ChildrenApi,
    owner: Mapping[str, Any],
    pool: Pool,
    image: str,
    runbook_base_url: str = alerts.RUNBOOK_BASE,
) -> Applied:
    """Create or apply the Deployment, the PodDisruptionBudget and the monitoring objects."""
    applied = Applied(deployment=pool.deployment_name)
    manifest = children.deployment(pool, image=image)
    manifest["spec"]["replicas"] = initial_replicas(pool)  # used only when it is created
    deployment = await _apply_child(kube, owner, manifest, applied)
    current = int((deployment.get("spec") or {}).get("replicas") or 0)
    bounded = 0 if pool.spec.paused else children.clamp_replicas(current, pool)
    if bounded != current:
        await kube.scale(pool.namespace, pool.deployment_name, bounded)
        applied.actions.append(f"rescaled Deployment {pool.deployment_name} {current}→{bounded}")
    await _apply_child(kube, owner, children.pod_disruption_budget(pool), applied)
    await _monitoring(kube, owner, pool, runbook_base_url, applied)
    return applied
