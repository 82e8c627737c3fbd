"""The emulated Kubernetes API server: kmock's emulator with the semantics kopf relies on.

kmock 0.8's `KubernetesEmulator` keeps objects and streams watch events, but treats them
as plain JSON: no server-owned metadata, no status codes beyond 200/404/409, no
subresources, selectors or versioned watches. `EmulatedKubeAPI` keeps kmock's machinery
(the reaction DSL, error rendering, discovery, the versioned `objects` array) and replaces
its state keeping with the rules in `kube_api_semantics`, applied under one thread lock so
that tests may read and write objects directly while the server runs on another thread.

Request parsing is the one layer written rather than overridden: kmock parses the URL
before any overridable hook, and its parser cannot address the `namespaces` resource
(`GET /api/v1/namespaces` raises, `/api/v1/namespaces/x` loses the plural).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import secrets
import string
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml

from support.kube import tables
from support.kube.apply import ApplyConflict, FieldOwnership
from support.kube.requests import manager_of, named, parse_request, with_status
from support.kube.semantics import (
    WatchChange,
    api_error,
    apply_defaults,
    builtin_resources,
    crd_resources,
    deployment_status,
    get_path,
    matches_selectors,
    merge_patch,
    scale_of,
    set_path,
    spec_part,
)
from support.kube.watching import Watcher, stream_watch

Body = dict[str, Any]
Key = tuple[kmock.resource, str | None, str]

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_NAME_ALPHABET = string.ascii_lowercase + string.digits
APPLY_PATCH = "application/apply-patch+yaml"
DIRECT_MANAGER = "emulator-direct"  # the manager of writes made through the direct methods
_MERGE_TYPES = {
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
}
_CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
_DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
_NAMESPACES = kmock.resource("", "v1", "namespaces")
EVENTS = (kmock.resource("", "v1", "events"), kmock.resource("events.k8s.io", "v1", "events"))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _accept(request: kmock.Request) -> str:
    return {key.lower(): value for key, value in request.headers.items()}.get("accept", "")


@attrs.define(kw_only=True)
class EmulatedKubeAPI(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with the server semantics kopf and clients rely on."""

    deployment_ready_delay: float = 0.0
    server_errors: list[Exception] = attrs.field(factory=list, init=False)
    _frozen: bool = attrs.field(default=False, init=False)
    _state_lock: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _changes: list[WatchChange] = attrs.field(factory=list, init=False)
    _watchers: set[Watcher] = attrs.field(factory=set, init=False)
    _scale_paths: dict[kmock.resource, tuple[str, str, str | None]] = attrs.field(
        factory=dict, init=False
    )
    _fields: dict[Key, FieldOwnership] = attrs.field(factory=dict, init=False)
    _columns: dict[kmock.resource, list[Body]] = attrs.field(factory=dict, init=False)
    _schemas: dict[kmock.resource, Body] = attrs.field(factory=dict, init=False)
    _loop: asyncio.AbstractEventLoop | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version
        self.fallback["get /apis/"] << self._serve_apis
        self.fallback["get /api/"] << self._serve_api
        self.fallback[kmock.method.PUT] << self._serve_replace
        for resource, info, scale in builtin_resources():
            self._resources[resource] = info
            if scale is not None:
                self._scale_paths[resource] = scale
        self.create_object(_NAMESPACES, None, {"metadata": {"name": "default"}})

    async def __aenter__(self) -> EmulatedKubeAPI:
        self._loop = asyncio.get_running_loop()
        await super().__aenter__()
        return self

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        try:
            request = await parse_request(raw_request, len(self._requests))
            self._requests.append(request)
            response = await self._handle(request)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        except Exception as exc:  # an emulator bug: reported as 500 and kept for the fixture
            self.server_errors.append(exc)
            return await self._render_error(exc)
        if request.action == kmock.action.CREATE and response.status == 200:
            response.set_status(201)  # a create answers 201 Created, as the API server does
        return response

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Skip kmock's own object tracking: the fallbacks below keep the state.
        return await kmock.RawHandler._handle(self, request)

    def _get_resources(self) -> list[kmock.resource]:
        return [res for res in self._resources if isinstance(res, kmock.resource)]

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        payload = await super()._serve_version(request)
        assert isinstance(payload, dict)
        payload["groupVersion"] = payload["groupVersion"].lstrip("/")  # "v1" for the core group
        return payload

    # -- direct, thread-safe state operations (the HTTP fallbacks call these too) --

    @property
    def freeze_deployments(self) -> bool:
        return self._frozen

    @freeze_deployments.setter
    def freeze_deployments(self, frozen: bool) -> None:
        self._frozen = frozen
        if not frozen:
            with self._state_lock:
                for key in [k for k in self._objects if k[0] == _DEPLOYMENTS]:
                    self._sync_deployment(key)

    def info(self, resource: kmock.resource) -> kmock.ResourceInfo:
        if resource not in self._resources:
            raise api_error(404, "NotFound", f"the server could not find the resource {resource}")
        return self._resources[resource]

    def get_object(self, resource: kmock.resource, namespace: str | None, name: str) -> Body:
        with self._state_lock:
            return copy.deepcopy(self._stored(self._key(resource, namespace, name)))

    def list_objects(
        self,
        resource: kmock.resource,
        namespace: str | None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Body]:
        self.info(resource)
        with self._state_lock:
            return [
                copy.deepcopy(obj.raw)
                for (res, ns, _), obj in sorted(
                    self._objects.items(), key=lambda i: (i[0][1] or "", i[0][2])
                )
                if res == resource and not obj.deleted and namespace in {None, ns}
                if matches_selectors(obj.raw, label_selector, field_selector)
            ]

    def create_object(
        self,
        resource: kmock.resource,
        namespace: str | None,
        body: Body,
        manager: str = DIRECT_MANAGER,
    ) -> Body:
        info = self.info(resource)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if namespace and meta.get("namespace") not in {None, namespace}:
            raise api_error(400, "BadRequest", "the namespace of the object does not match")
        namespace = (namespace or meta.get("namespace")) if info.namespaced else None
        if info.namespaced and not namespace:
            raise api_error(422, "Invalid", "metadata.namespace is required")
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise api_error(422, "Invalid", "metadata.name or generateName is required")
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(_NAME_ALPHABET) for _ in range(5)
            )
        with self._state_lock:
            if namespace is not None:
                self._stored(self._key(_NAMESPACES, None, namespace))
            key = self._key(resource, namespace, meta["name"])
            if key in self._objects and not self._objects[key].deleted:
                raise api_error(
                    409, "AlreadyExists", f"{resource.plural} {key[2]!r} already exists"
                )
            group_version = f"{resource.group}/{resource.version}".lstrip("/")
            obj.update({"apiVersion": group_version, "kind": info.kind})
            if "status" in info.subresources:
                obj.pop("status", None)
            if resource in self._schemas:
                obj = apply_defaults(self._schemas[resource], obj)
                meta = obj["metadata"]
            for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(field, None)
            if namespace is not None:
                meta["namespace"] = namespace
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            if resource == _NAMESPACES:
                obj["status"] = {"phase": "Active"}
            if resource == _CRDS:
                names = obj.get("spec", {}).get("names", {})
                conditions = [
                    {"type": t, "status": "True"} for t in ("NamesAccepted", "Established")
                ]
                obj["status"] = {"acceptedNames": names, "conditions": conditions}
            meta.pop("managedFields", None)
            self._fields[key] = FieldOwnership()
            self._own(key, manager, None, obj)
            self._store(key, "ADDED", obj, None)
            self._after_write(key)
            return copy.deepcopy(obj)

    def update_object(
        self,
        resource: kmock.resource,
        namespace: str | None,
        name: str,
        change: Body | list[Any],
        content_type: str,
        subresource: str | None = None,
        manager: str = DIRECT_MANAGER,
        force: bool = False,
    ) -> Body:
        """Patch (merge, JSON or apply) or replace ("replace") an object or subresource."""
        info = self.info(resource)
        if subresource is not None and subresource not in info.subresources:
            raise api_error(404, "NotFound", f"{resource.plural} has no {subresource} subresource")
        with self._state_lock:
            key = self._key(resource, namespace, name)
            if content_type == APPLY_PATCH:
                return self._server_side_apply(key, change, manager, force, subresource)
            old = self._stored(key)
            target = scale_of(old, self._scale_paths[resource]) if subresource == "scale" else old
            changed = self._apply(target, change, content_type)
            if subresource == "scale":
                spec_path = self._scale_paths[resource][0]
                replicas = get_path(changed, ".spec.replicas")
                changed = set_path(copy.deepcopy(old), spec_path, replicas)
            new = self._merge_update(info, old, changed, subresource, resource)
            if subresource != "status":
                self._own(key, manager, old, new)
            if new != old:
                self._store(key, "MODIFIED", new, old)
                self._after_write(key)
            return self.get_scale(key) if subresource == "scale" else copy.deepcopy(new)

    def _server_side_apply(
        self, key: Key, config: Any, manager: str, force: bool, subresource: str | None
    ) -> Body:
        """Apply `config` as `manager` (creating the object when it does not exist)."""
        if not isinstance(config, dict) or subresource is not None:
            raise api_error(400, "BadRequest", "apply takes one object, on the main resource")
        if not manager:
            raise api_error(400, "BadRequest", "fieldManager is required for apply patches")
        resource, namespace, name = key
        if (config.get("metadata") or {}).get("name") not in {None, name}:
            raise api_error(400, "BadRequest", "the name of the object does not match the URL")
        if key not in self._objects or self._objects[key].deleted:
            self.create_object(resource, namespace, config, manager="")
            self._fields[key] = FieldOwnership()  # the apply below owns what it created
        old = self._stored(key)
        try:
            applied = self._fields[key].apply(old, config, manager, force=force)
        except ApplyConflict as exc:
            raise api_error(409, "Conflict", f"Apply failed with conflicts: {exc}") from None
        new = self._merge_update(self.info(resource), old, applied, None, resource)
        new["metadata"]["managedFields"] = self._fields[key].managed_fields(old["apiVersion"])
        if new != old:
            self._store(key, "MODIFIED", new, old)
            self._after_write(key)
        return copy.deepcopy(self._objects[key].raw)

    def _own(self, key: Key, manager: str, old: Body | None, new: Body) -> None:
        """Record an Update by `manager` and show the ownership in `managedFields`."""
        fields = self._fields.setdefault(key, FieldOwnership())
        if manager:
            fields.record_update(manager, old, new)
        new["metadata"]["managedFields"] = fields.managed_fields(new["apiVersion"])

    def get_scale(self, key: Key) -> Body:
        with self._state_lock:
            return scale_of(self._stored(key), self._scale_paths[key[0]])

    def delete_object(
        self, resource: kmock.resource, namespace: str | None, name: str, orphan: bool = False
    ) -> Body:
        self.info(resource)
        with self._state_lock:
            key = self._key(resource, namespace, name)
            obj = copy.deepcopy(self._stored(key))
            if not obj["metadata"].get("finalizers"):
                self._remove(key, orphan=orphan)
            elif not obj["metadata"].get("deletionTimestamp"):
                old = copy.deepcopy(obj)
                obj["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
                self._store(key, "MODIFIED", obj, old)
            return copy.deepcopy(obj)

    def close_watches(self) -> None:
        """End every open watch stream (so that the server can stop without waiting)."""
        with self._state_lock:
            for watcher in self._watchers:
                watcher.push(None)

    # -- internals; callers hold the state lock --

    def _key(self, resource: kmock.resource, namespace: str | None, name: str) -> Key:
        return resource, (namespace if self.info(resource).namespaced else None), name

    def _stored(self, key: Key) -> Body:
        if key not in self._objects or self._objects[key].deleted:
            raise api_error(404, "NotFound", f"{key[0].plural} {key[2]!r} not found")
        return self._objects[key].raw

    def _store(self, key: Key, kind: str, obj: Body | None, old: Body | None) -> None:
        self._rv += 1
        if obj is None:  # deletion: the event carries the last state with a new version
            assert old is not None
            self._objects[key].delete()
            event_obj = copy.deepcopy(old)
        else:
            obj["metadata"]["resourceVersion"] = str(self._rv)
            if key in self._objects:
                self._objects[key].history.append(copy.deepcopy(obj))
            else:
                self._objects[key] = copy.deepcopy(obj)
            event_obj = copy.deepcopy(obj)
        event_obj["metadata"]["resourceVersion"] = str(self._rv)
        change = WatchChange(self._rv, kind, key[0], event_obj, copy.deepcopy(old))
        self._changes.append(change)
        for watcher in self._watchers:
            watcher.push(change)

    def _remove(self, key: Key, orphan: bool = False) -> None:
        old = self._objects[key].raw
        self._store(key, "DELETED", None, old)
        if key[0] == _CRDS:
            self._unregister_crd(old)
        if orphan:
            return
        alive = {obj.raw["metadata"]["uid"] for obj in self._objects.values() if not obj.deleted}
        for dep_key, dep in list(self._objects.items()):
            refs = [] if dep.deleted else dep.raw["metadata"].get("ownerReferences", [])
            owners = {ref.get("uid") for ref in refs}
            if old["metadata"]["uid"] in owners and not owners & alive:
                self.delete_object(*dep_key)

    def _apply(self, target: Body, change: Body | list[Any], content_type: str) -> Body:
        if content_type == "replace" and isinstance(change, dict):
            return copy.deepcopy(change)
        if content_type == "application/json-patch+json" and isinstance(change, list):
            try:
                return dict(jsonpatch.apply_patch(target, change))
            except jsonpatch.JsonPatchTestFailed as exc:
                raise api_error(422, "Invalid", f"the JSON-patch test failed: {exc}") from exc
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise api_error(422, "Invalid", f"the JSON-patch cannot apply: {exc}") from exc
        if content_type in _MERGE_TYPES and isinstance(change, dict):
            merged: Body = merge_patch(target, change)
            return merged
        raise api_error(415, "UnsupportedMediaType", f"unsupported patch: {content_type}")

    def _merge_update(
        self,
        info: kmock.ResourceInfo,
        old: Body,
        new: Body,
        subresource: str | None,
        resource: kmock.resource,
    ) -> Body:
        if subresource == "status":
            new = with_status(old, new.get("status"))
        elif "status" in info.subresources:
            new = with_status(new, old.get("status"))
        given_rv = new.get("metadata", {}).get("resourceVersion")
        if given_rv is not None and given_rv != old["metadata"]["resourceVersion"]:
            raise api_error(409, "Conflict", "the object has been modified; reload and retry")
        meta = new.setdefault("metadata", {})
        for field in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ):
            meta.pop(field, None)
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
        new.update(apiVersion=old["apiVersion"], kind=old["kind"])
        added = set(meta.get("finalizers", [])) - set(old["metadata"].get("finalizers", []))
        if meta.get("deletionTimestamp") and added:
            raise api_error(422, "Invalid", "no new finalizers while being deleted")
        if subresource != "status" and resource in self._schemas:
            new = apply_defaults(self._schemas[resource], new)
            meta = new["metadata"]
        if spec_part(new) != spec_part(old):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        return new

    def _after_write(self, key: Key) -> None:
        obj = self._objects[key].raw
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(key)
        elif key[0] == _CRDS:
            self._register_crd(obj)
        elif key[0] == _DEPLOYMENTS:
            self._sync_deployment(key)
            if self.deployment_ready_delay > 0 and self._loop is not None:
                later = self._loop.call_later
                args = (self.deployment_ready_delay, self._ready_later, key)
                with contextlib.suppress(RuntimeError):  # the server has stopped
                    self._loop.call_soon_threadsafe(later, *args)

    def _ready_later(self, key: Key) -> None:
        with self._state_lock:
            self._sync_deployment(key, ready_now=True)

    def _sync_deployment(self, key: Key, ready_now: bool = False) -> None:
        if self._frozen or key not in self._objects or self._objects[key].deleted:
            return
        old = self._objects[key].raw
        status = deployment_status(old, ready_now or self.deployment_ready_delay <= 0)
        if status != old.get("status"):
            self._store(key, "MODIFIED", with_status(old, status), old)

    def _register_crd(self, crd: Body) -> None:
        versions = {v["name"]: v for v in crd.get("spec", {}).get("versions", [])}
        for resource, info, scale in crd_resources(crd):
            self._resources[resource] = info
            if scale is not None:
                self._scale_paths[resource] = scale
            version = versions.get(resource.version or "", {})
            self._columns[resource] = list(version.get("additionalPrinterColumns") or [])
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema:
                self._schemas[resource] = schema

    def _unregister_crd(self, crd: Body) -> None:
        for resource, _, _ in crd_resources(crd):
            for key in [k for k in self._objects if k[0] == resource]:
                if not self._objects[key].deleted:
                    self._store(key, "DELETED", None, self._objects[key].raw)
            self._resources.pop(resource, None)

    # -- HTTP fallbacks --

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        resource = request.resource
        if resource is None:
            raise kmock.KubernetesEndpointNotFoundError()
        info = self.info(resource)
        with self._state_lock:
            items = self.list_objects(
                resource,
                request.namespace,
                request.params.get("labelSelector", ""),
                request.params.get("fieldSelector", ""),
            )
            version = str(self._rv)
        if tables.wants_table(_accept(request)):
            return tables.table(items, self._columns.get(resource), version)
        return {
            "apiVersion": f"{resource.group}/{resource.version}".lstrip("/"),
            "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": version, "continue": ""},
            "items": items,
        }

    def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        # Not a generator itself, so that a 404 or 400 is answered before the stream starts.
        if request.resource is None:
            raise kmock.KubernetesEndpointNotFoundError()
        self.info(request.resource)
        since = request.params.get("resourceVersion", "")
        timeout = request.params.get("timeoutSeconds", "")
        if not (since.isdigit() or since == "") or not (timeout.isdigit() or timeout == ""):
            raise api_error(400, "BadRequest", "resourceVersion and timeoutSeconds are numbers")
        return stream_watch(self, request, request.resource, since, float(timeout or "inf"))

    async def _serve_fetch(self, request: kmock.Request) -> kmock.Payload:
        resource, name = named(request)
        if request.subresource not in {None, *self.info(resource).subresources}:
            raise api_error(404, "NotFound", f"{resource.plural} has no {request.subresource}")
        if request.subresource == "scale":
            return self.get_scale(self._key(resource, request.namespace, name))
        found = self.get_object(resource, request.namespace, name)
        if tables.wants_table(_accept(request)):
            return tables.table([found], self._columns.get(resource), str(self._rv))
        return found

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        if request.resource is None:
            raise kmock.KubernetesEndpointNotFoundError()
        if not isinstance(request.data, dict):
            raise api_error(400, "BadRequest", "the request body must be a JSON object")
        return self.create_object(
            request.resource, request.namespace, request.data, manager=manager_of(request)
        )

    async def _serve_update(self, request: kmock.Request) -> kmock.Payload:
        resource, name = named(request)
        headers = {key.lower(): value for key, value in request.headers.items()}
        content_type = headers.get("content-type", "").split(";")[0].strip()
        change = request.data
        if content_type == APPLY_PATCH and change is None:
            change = yaml.safe_load(request.text)  # kubectl sends YAML
        force = request.params.get("force") in {"true", "1"}
        return self.update_object(
            resource,
            request.namespace,
            name,
            change,
            content_type,
            request.subresource,
            manager=manager_of(request),
            force=force,
        )

    async def _serve_replace(self, request: kmock.Request) -> kmock.Payload:
        resource, name = named(request)
        change = request.data
        return self.update_object(
            resource,
            request.namespace,
            name,
            change,
            "replace",
            request.subresource,
            manager=manager_of(request),
        )

    async def _serve_delete(self, request: kmock.Request) -> kmock.Payload:
        resource, name = named(request)
        options = request.data if isinstance(request.data, dict) else {}
        policy = request.params.get("propagationPolicy") or options.get("propagationPolicy")
        return self.delete_object(resource, request.namespace, name, orphan=policy == "Orphan")
