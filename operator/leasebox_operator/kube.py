"""Thin Kubernetes API helpers on kopf's own authenticated client.

kopf already holds the credentials, the retry policy and the session, so the operator
talks to the API through the same client instead of a second one with its own login.
kopf keeps that client internal; this module is the only place that touches it (the kopf
version is pinned), and everything above it sees plain dicts, `None` for "not found" and
`SecretError` for a Secret that cannot be used.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kopf._cogs.clients import api, errors

from leasebox_operator.polling import DeploymentState

MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
DISCOVERY_TTL_SECONDS = 300.0


class SecretError(Exception):
    """A referenced Secret or key is missing; the message names them, never a value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """`/api/v1/...` or `/apis/group/version/...` for a resource, object or subresource."""
    parts = ["api", api_version] if "/" not in api_version else ["apis", api_version]
    if namespace:
        parts += ["namespaces", namespace]
    parts.append(plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/" + "/".join(parts)


class Kube:
    """GET/POST/PATCH/DELETE through kopf's client, inside a running operator."""

    _discovery: dict[str, tuple[float, frozenset[str]]] = {}

    def __init__(self, settings: kopf.OperatorSettings, logger: logging.Logger | Any) -> None:
        self.settings = settings
        self.logger = logger

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await api.get(path, settings=self.settings, logger=self.logger)
        except errors.APINotFoundError:
            return None
        return result

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The created object, or None when one of that name already exists."""
        try:
            result: dict[str, Any] = await api.post(
                path, payload=dict(body), settings=self.settings, logger=self.logger
            )
        except errors.APIConflictError:
            return None
        return result

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await api.patch(
            path,
            payload=dict(patch),
            headers=MERGE_PATCH,
            settings=self.settings,
            logger=self.logger,
        )
        return result

    async def delete(self, path: str) -> bool:
        """Delete; False when it was already gone."""
        try:
            await api.delete(path, settings=self.settings, logger=self.logger)
        except errors.APINotFoundError:
            return False
        return True

    async def serves(self, api_version: str, plural: str) -> bool:
        """Whether the cluster serves `plural` in `api_version` (e.g. a PodMonitor CRD)."""
        cached = self._discovery.get(api_version)
        if cached is None or time.monotonic() - cached[0] > DISCOVERY_TTL_SECONDS:
            try:
                listing = await api.get(
                    f"/apis/{api_version}", settings=self.settings, logger=self.logger
                )
            except errors.APIClientError:
                listing = {}
            names = frozenset(r.get("name", "") for r in (listing or {}).get("resources", []))
            cached = (time.monotonic(), names)
            self._discovery[api_version] = cached
        return plural in cached[1]

    async def secret_keys(self, namespace: str, name: str) -> frozenset[str]:
        """The keys of a Secret (not their values); `SecretError` when it does not exist."""
        secret = await self.get(resource_path("v1", "secrets", namespace, name))
        if secret is None:
            raise SecretError("SecretNotFound", f"Secret {namespace}/{name} does not exist")
        return frozenset([*(secret.get("data") or {}), *(secret.get("stringData") or {})])

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        """One key of a Secret, decoded; `SecretError` when the Secret or the key is missing."""
        secret = await self.get(resource_path("v1", "secrets", namespace, name))
        if secret is None:
            raise SecretError("SecretNotFound", f"Secret {namespace}/{name} does not exist")
        data = secret.get("data") or {}
        string_data = secret.get("stringData") or {}
        if key in data:
            try:
                return base64.b64decode(data[key], validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise SecretError(
                    "SecretKeyInvalid", f"key {key!r} of Secret {namespace}/{name} is not text"
                ) from None
        if key in string_data:
            return str(string_data[key])
        raise SecretError("SecretKeyMissing", f"Secret {namespace}/{name} has no key {key!r}")


class PoolKubeAdapter:
    """The poll loop's view of Kubernetes for one pool (implements `polling.PoolKube`)."""

    def __init__(self, kube: Kube, body: Any, namespace: str, deployment: str) -> None:
        self.kube = kube
        self.body = body
        self.path = resource_path("apps/v1", "deployments", namespace, deployment)

    async def read_deployment(self) -> DeploymentState | None:
        found = await self.kube.get(self.path)
        if found is None:
            return None
        return DeploymentState(
            replicas=int((found.get("spec") or {}).get("replicas") or 0),
            ready_replicas=int((found.get("status") or {}).get("readyReplicas") or 0),
        )

    async def scale(self, replicas: int) -> None:
        await self.kube.merge_patch(self.path, {"spec": {"replicas": replicas}})

    def event(self, type_: str, reason: str, message: str) -> None:
        kopf.event(self.body, type=type_, reason=reason, message=message)
