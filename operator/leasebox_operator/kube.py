"""The operator's Kubernetes calls, on the official client's transport, as plain dicts.

Everything the operator reads, watches or writes besides what kopf watches goes through
here: children are *applied* with server-side apply under one field manager, never forcing
on the first try, so that a conflict with another manager comes back as `FieldConflict` and
the caller decides (see `reconcile._apply_child`), the worker replicas change only through
the Deployment's `scale` subresource, Secrets are read key by key, the pool's status is
merge-patched, and Events are posted as the operator's own (kopf's are turned off). Callers
see dicts, `None` for "not found" and `PoolProblem`s for what a person has to fix.

Requests go out as JSON on a path, through the client's authentication and connection pool
(`Kube._json`), not through its generated methods: those validate every argument and turn
every answer into model objects and back into dicts, which at hundreds of pools was the
larger part of the operator's CPU. The answers are the server's JSON, read once.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import quote, urlencode

from kubernetes.aio import client

from leasebox_operator.children import CHILD_RESOURCES
from leasebox_operator.errors import FieldConflict, SecretError
from leasebox_operator.models import GROUP, PLURAL, VERSION

FIELD_MANAGER = "leasebox-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON = "application/json"
# How long a discovery answer is reused: an API group that is served rarely goes away, while
# one that is missing (the Prometheus Operator's CRDs, say) may be installed any minute.
DISCOVERY_TTL_SECONDS = 300.0
DISCOVERY_MISSING_TTL_SECONDS = 10.0
# The server names the other manager of a contested field in each cause's message.
CONFLICT_MANAGER = re.compile(r'conflict with "([^"]+)"')


def _q(segment: str) -> str:
    """One path segment, escaped (names and namespaces are DNS labels; this is a guard)."""
    return quote(segment, safe="")


def _child_path(kind: str, namespace: str, name: str | None = None) -> str:
    api_version, plural = CHILD_RESOURCES[kind]
    path = f"/apis/{api_version}/namespaces/{_q(namespace)}/{plural}"
    return path if name is None else f"{path}/{_q(name)}"


def _missing(exc: client.ApiException) -> bool:
    return bool(exc.status == 404)


def _conflict(kind: str, name: str, exc: client.ApiException) -> FieldConflict:
    """The fields of a refused apply and their managers, from the server's Status body."""
    try:
        causes = (json.loads(exc.body or "{}").get("details") or {}).get("causes") or []
    except ValueError:
        causes = []
    fields = tuple(
        (str(c.get("field", "")), m[1])
        for c in causes
        if (m := CONFLICT_MANAGER.search(str(c.get("message", ""))))
    )
    listed = ", ".join(f"{f} (held by {m!r})" for f, m in fields) or "fields held by others"
    return FieldConflict(f"{kind} {name}: {listed}", fields)


class Kube:
    """The operator's API calls, on one `kubernetes.aio` API client.

    Its discovery answers (`serves`) are its own; the operator makes one `Kube`, held by its
    runtime (`handlers.Runtime.kube`), so every pool shares them.
    """

    def __init__(self, api: Callable[[], client.ApiClient], *, instance: str = "") -> None:
        """`api` returns the current client: a login after a 401 replaces it."""
        self._api = api
        self.component = FIELD_MANAGER
        self.instance = instance or FIELD_MANAGER
        self._discovery: dict[str, tuple[float, frozenset[str]]] = {}

    @property
    def api(self) -> client.ApiClient:
        return self._api()

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    async def _json(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        content_type: str = JSON,
        **params: Any,
    ) -> dict[str, Any]:
        """One request on `path` with the client's credentials; the answer's JSON.

        A status outside 2xx is the client's own `ApiException`, with the server's body, as
        its generated methods raise it.
        """
        api = self.api
        headers = {"Accept": JSON, "Content-Type": content_type}
        query = {k: v for k, v in params.items() if v is not None}
        if query:
            path = f"{path}?{urlencode(query)}"
        method, url, headers, _, _ = await api.param_serialize(
            method, path, header_params=headers, auth_settings=["BearerToken"]
        )
        # The transport writes the body as JSON itself (for apply too: JSON is YAML).
        payload = None if body is None else dict(body)
        response = await api.call_api(method, url, headers, payload)
        data = await response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise client.ApiException(http_resp=response)
        return cast(dict[str, Any], json.loads(data)) if data else {}

    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A child by kind, or None when it does not exist."""
        try:
            return await self._json("GET", _child_path(kind, namespace, name))
        except client.ApiException as exc:
            if _missing(exc):
                return None
            raise

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create a child (the creator owns every field); None when the name is taken."""
        kind, namespace = manifest["kind"], manifest["metadata"]["namespace"]
        try:
            return await self._json(
                "POST", _child_path(kind, namespace), body=manifest, fieldManager=FIELD_MANAGER
            )
        except client.ApiException as exc:
            if exc.status == 409:
                return None
            raise

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = False) -> dict[str, Any]:
        """Server-side apply a child under the operator's field manager.

        Without `force`, fields another manager holds are a `FieldConflict` naming them.
        """
        kind, meta = manifest["kind"], manifest["metadata"]
        try:
            return await self._json(
                "PATCH",
                _child_path(kind, meta["namespace"], meta["name"]),
                body=manifest,
                content_type=APPLY,
                fieldManager=FIELD_MANAGER,
                force="true" if force else "false",
            )
        except client.ApiException as exc:
            if exc.status == 409 and not force:
                raise _conflict(kind, meta["name"], exc) from None
            raise

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete a child; False when it was already gone."""
        try:
            await self._json("DELETE", _child_path(kind, namespace, name))
        except client.ApiException as exc:
            if _missing(exc):
                return False
            raise
        return True

    async def _deployments(self, namespace: str | None, **options: Any) -> Any:
        """The raw response of a list or watch of Deployments (all namespaces for None)."""
        apps = self.apps
        response = await (
            apps.list_deployment_for_all_namespaces_without_preload_content(**options)
            if namespace is None
            else apps.list_namespaced_deployment_without_preload_content(namespace, **options)
        )
        if not 200 <= response.status <= 299:
            response.release()
            raise client.ApiException(status=response.status, reason=response.reason)
        return response

    async def list_deployments(self, namespace: str | None, selector: str) -> dict[str, Any]:
        """The Deployments `selector` matches, as raw JSON (hundreds cost no model objects)."""
        async with await self._deployments(namespace, label_selector=selector) as response:
            return cast(dict[str, Any], json.loads(await response.read()))

    async def watch_deployments(
        self, namespace: str | None, selector: str, version: str, seconds: int
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events (`type`, `object`) after `version`, for `seconds` at most."""
        options: dict[str, Any] = {"label_selector": selector, "resource_version": version}
        options |= {"watch": True, "allow_watch_bookmarks": True, "timeout_seconds": seconds}
        options |= {"_request_timeout": seconds + 30.0}
        async with await self._deployments(namespace, **options) as response:
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)

    async def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        """Set the Deployment's replicas through its `scale` subresource."""
        await self._json(
            "PATCH",
            f"{_child_path('Deployment', namespace, deployment)}/scale",
            body={"spec": {"replicas": replicas}},
            content_type=MERGE,
            fieldManager=FIELD_MANAGER,
        )

    async def serves(self, api_version: str, plural: str) -> bool:
        """Whether the cluster serves `plural` in `api_version` (e.g. a PodMonitor CRD)."""
        cached = self._discovery.get(api_version)
        if cached is None or time.monotonic() - cached[0] > (
            DISCOVERY_TTL_SECONDS if plural in cached[1] else DISCOVERY_MISSING_TTL_SECONDS
        ):
            group, _, version = api_version.rpartition("/")
            try:
                listing = await self.custom.get_api_resources(group, version)
                names = frozenset(r.name for r in listing.resources or ())
            except client.ApiException as exc:
                if not _missing(exc):
                    raise
                names = frozenset()
            cached = (time.monotonic(), names)
            self._discovery[api_version] = cached
        return plural in cached[1]

    async def _secret(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return await self._json("GET", f"/api/v1/namespaces/{_q(namespace)}/secrets/{_q(name)}")
        except client.ApiException as exc:
            if _missing(exc):
                raise SecretError(f"Secret {namespace}/{name} does not exist") from None
            if exc.status == 403:
                raise SecretError(
                    f"the operator may not read Secret {namespace}/{name} (add it to the "
                    "chart's rbac.secretNames)",
                    "SecretForbidden",
                ) from None
            raise

    async def secret_keys(self, namespace: str, name: str) -> frozenset[str]:
        """The keys of a Secret (not their values); `SecretError` when it does not exist."""
        secret = await self._secret(namespace, name)
        return frozenset([*(secret.get("data") or {}), *(secret.get("stringData") or {})])

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        """One key of a Secret, decoded; `SecretError` when the Secret or the key is missing."""
        secret = await self._secret(namespace, name)
        data, string_data = secret.get("data") or {}, secret.get("stringData") or {}
        if key in data:
            try:
                return base64.b64decode(data[key], validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise SecretError(
                    f"key {key!r} of Secret {namespace}/{name} is not text", "SecretKeyInvalid"
                ) from None
        if key in string_data:
            return str(string_data[key])
        raise SecretError(f"Secret {namespace}/{name} has no key {key!r}", "SecretKeyMissing")

    async def patch_pool_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        await self._json(
            "PATCH",
            f"/apis/{GROUP}/{VERSION}/namespaces/{_q(namespace)}/{PLURAL}/{_q(name)}/status",
            body={"status": dict(patch)},
            content_type=MERGE,
            fieldManager=FIELD_MANAGER,
        )

    async def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None:
        """One core/v1 Event about `involved` (a resource body), as the operator's."""
        meta = involved.get("metadata") or {}
        now = datetime.now(UTC)
        namespace = meta.get("namespace") or "default"
        event: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{meta.get('name', 'pool')}.",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "count": 1,
        }
        await self._json("POST", f"/api/v1/namespaces/{_q(namespace)}/events", body=event)

    async def ensure_peering(self, name: str, namespace: str | None) -> bool:
        """Create kopf's peering object when missing (peers talk through it); True if made."""
        body = {"apiVersion": "kopf.dev/v1", "metadata": {"name": name}}
        try:
            if namespace is None:
                body["kind"] = "ClusterKopfPeering"
                await self.custom.create_cluster_custom_object(
                    "kopf.dev", "v1", "clusterkopfpeerings", body
                )
            else:
                body["kind"] = "KopfPeering"
                await self.custom.create_namespaced_custom_object(
                    "kopf.dev", "v1", namespace, "kopfpeerings", body
                )
        except client.ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True
