"""The pure rules of the Kubernetes API that the test suite's emulated server follows.

Kept apart from the server (`kube_api_server`) so that each rule reads on its own and none
needs a running loop: which built-in resources exist, what a CRD makes servable, how a
merge-patch applies (RFC 7386), how label and field selectors match, what part of an
object counts for `generation`, which watch event a change means to a watcher, and how an
API path splits into resource, namespace, name and subresource.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import attrs
import kmock

Body = dict[str, Any]
ScalePaths = tuple[str, str, str | None]  # spec replicas, status replicas, status selector
Served = tuple[kmock.resource, kmock.ResourceInfo, ScalePaths | None]

NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

# (group, version, plural), kind, namespaced, subresources
_BUILTINS: tuple[tuple[tuple[str, str, str], str, bool, tuple[str, ...]], ...] = (
    (("", "v1", "namespaces"), "Namespace", False, ("status",)),
    (("", "v1", "secrets"), "Secret", True, ()),
    (("", "v1", "events"), "Event", True, ()),
    (("", "v1", "configmaps"), "ConfigMap", True, ()),
    (("", "v1", "pods"), "Pod", True, ("status",)),
    (("apps", "v1", "deployments"), "Deployment", True, ("status", "scale")),
    (("policy", "v1", "poddisruptionbudgets"), "PodDisruptionBudget", True, ("status",)),
    (("events.k8s.io", "v1", "events"), "Event", True, ()),
    (
        ("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
        "CustomResourceDefinition",
        False,
        ("status",),
    ),
    (("coordination.k8s.io", "v1", "leases"), "Lease", True, ()),
    (("kopf.dev", "v1", "clusterkopfpeerings"), "ClusterKopfPeering", False, ()),
    (("kopf.dev", "v1", "kopfpeerings"), "KopfPeering", True, ()),
)
_DEPLOYMENT_SCALE: ScalePaths = (".spec.replicas", ".status.replicas", ".spec.selector.matchLabels")


def builtin_resources() -> list[Served]:
    """Fresh discovery records for the built-in resources (records are mutable)."""
    return [
        (
            kmock.resource(group=gvp[0], version=gvp[1], plural=gvp[2]),
            kmock.ResourceInfo(
                kind=kind,
                singular=kind.lower(),
                namespaced=namespaced,
                verbs=set(VERBS),
                subresources=set(subresources),
            ),
            _DEPLOYMENT_SCALE if "scale" in subresources else None,
        )
        for gvp, kind, namespaced, subresources in _BUILTINS
    ]


def crd_resources(crd: Body) -> list[Served]:
    """What a CustomResourceDefinition makes servable: one resource per served version."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    served: list[Served] = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        scale = subresources.get("scale")
        info = kmock.ResourceInfo(
            kind=names.get("kind"),
            singular=names.get("singular") or str(names.get("kind", "")).lower(),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            verbs=set(VERBS),
            shortnames=set(names.get("shortNames", [])),
            categories=set(names.get("categories", [])),
            subresources={sub for sub in ("status", "scale") if sub in subresources},
        )
        paths: ScalePaths | None = None
        if scale is not None:
            paths = (
                scale["specReplicasPath"],
                scale["statusReplicasPath"],
                scale.get("labelSelectorPath"),
            )
        resource = kmock.resource(
            group=spec.get("group", ""), version=version["name"], plural=names.get("plural")
        )
        served.append((resource, info, paths))
    return served


def scale_of(obj: Body, paths: ScalePaths) -> Body:
    """The `autoscaling/v1` Scale that a `/scale` subresource shows for an object."""
    spec_path, status_path, selector_path = paths
    selector = get_path(obj, selector_path) if selector_path else None
    if isinstance(selector, dict):  # a Deployment's matchLabels
        selector = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
    keep = {"name", "namespace", "uid", "resourceVersion", "creationTimestamp"}
    meta = {key: value for key, value in obj["metadata"].items() if key in keep}
    status = {"replicas": get_path(obj, status_path) or 0}
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": meta,
        "spec": {"replicas": get_path(obj, spec_path) or 0},
        "status": status | ({"selector": selector} if selector else {}),
    }


def deployment_status(deployment: Body, ready_now: bool) -> Body:
    """What a Deployment controller reports once it has seen the current spec.

    Counts follow `spec.replicas` at once; readiness follows only when `ready_now`
    (pods still starting), except that a scale-down loses readiness at once. Zero counts
    are omitted, as the API server omits them.
    """
    wanted = deployment.get("spec", {}).get("replicas", 1)
    ready = (
        wanted if ready_now else min(deployment.get("status", {}).get("readyReplicas", 0), wanted)
    )
    counts = {
        "replicas": wanted,
        "updatedReplicas": wanted,
        "readyReplicas": ready,
        "availableReplicas": ready,
    }
    status: Body = {key: value for key, value in counts.items() if value}
    status["observedGeneration"] = deployment["metadata"].get("generation", 1)
    return status


def api_error(status: int, reason: str, message: str) -> kmock.KubernetesError:
    """An error rendered as a Kubernetes `Status` with this HTTP status and reason."""
    return kmock.KubernetesError(
        status=status, reason=reason, message=message, details={"causes": [{"message": message}]}
    )


def apply_defaults(schema: Body, value: Any) -> Any:
    """`value` with an OpenAPI schema's defaults filled in, recursively (a copy), as the API
    server defaults a custom resource before it validates and stores it."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in list(value):
                if key not in (schema.get("properties") or {}):
                    value[key] = apply_defaults(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge-patch: dicts merge, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def spec_part(obj: Body) -> Body:
    """What `generation` counts: everything except metadata and status."""
    return {key: value for key, value in obj.items() if key not in {"metadata", "status"}}


def get_path(obj: Body, path: str) -> Any:
    """The value at a dotted path such as `.spec.replicas` (None if absent)."""
    value: Any = obj
    for part in path.strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def set_path(obj: Body, path: str, value: Any) -> Body:
    """Set the value at a dotted path, creating the intermediate dicts; returns `obj`."""
    *parents, leaf = path.strip(".").split(".")
    node = obj
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return obj


_SPLIT = re.compile(r",(?![^(]*\))")
_LABEL_REQ = re.compile(
    r"(?P<neg>!?)\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?"
)
_FIELD_REQ = re.compile(r"(?P<path>[A-Za-z0-9._-]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*)")


def _requirements(selector: str) -> list[str]:
    return [part.strip() for part in _SPLIT.split(selector) if part.strip()]


def _label_matches(labels: dict[str, str], requirement: str) -> bool:
    match = _LABEL_REQ.fullmatch(requirement)
    if match is None or (match["neg"] and (match["op"] or match["setop"])):
        raise api_error(400, "BadRequest", f"unable to parse requirement: {requirement!r}")
    key, value = match["key"], labels.get(match["key"])
    if match["setop"]:
        values = {v.strip() for v in match["values"].split(",")}
        return value in values if match["setop"] == "in" else value not in values
    if match["op"] == "!=":
        return value != match["value"]
    if match["op"]:
        return value == match["value"]
    return (key in labels) != bool(match["neg"])


def _field_matches(obj: Body, requirement: str) -> bool:
    match = _FIELD_REQ.fullmatch(requirement)
    if match is None:
        raise api_error(400, "BadRequest", f"invalid field selector: {requirement!r}")
    actual = get_path(obj, match["path"])
    text = (
        "" if actual is None else str(actual).lower() if isinstance(actual, bool) else str(actual)
    )
    return (text == match["value"]) != (match["op"] == "!=")


def matches_selectors(obj: Body, label_selector: str = "", field_selector: str = "") -> bool:
    """Whether an object matches a labelSelector and a fieldSelector (both may be empty)."""
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(_label_matches(labels, req) for req in _requirements(label_selector)) and all(
        _field_matches(obj, req) for req in _requirements(field_selector)
    )


@attrs.frozen
class WatchChange:
    """One stored change: the new (or, for deletions, last) state and the state before it."""

    version: int
    type: str
    resource: kmock.resource
    obj: Body
    old: Body | None

    def event_for(
        self, resource: kmock.resource, namespace: str | None, label: str, field: str
    ) -> Body | None:
        """The watch event this change means to a watcher, if any.

        An object that starts or stops matching the selectors is ADDED or DELETED for
        that watcher, as a real API server does.
        """
        if self.resource != resource:
            return None
        if namespace is not None and self.obj["metadata"].get("namespace") != namespace:
            return None
        now = self.type != "DELETED" and matches_selectors(self.obj, label, field)
        before = self.old is not None and matches_selectors(self.old, label, field)
        if now and before:
            kind = "MODIFIED"
        elif now or before:
            kind = "ADDED" if now else "DELETED"
        else:
            return None
        return {"type": kind, "object": copy.deepcopy(self.obj)}


def parse_path(path: str) -> tuple[kmock.resource, str | None, str | None, str | None] | None:
    """Split an API path into (resource, namespace, name, subresource); None if not an API path."""
    parts = path.strip("/").split("/")
    version: str | None
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 2 and parts[0] == "apis":
        group, version, rest = parts[1], (parts[2] if len(parts) > 2 else None), parts[3:]
    else:
        return None
    namespace = None
    namespace_subresource = len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES
    if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_subresource:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return kmock.resource(group=group, version=version, plural=plural), namespace, name, subresource


def guess_action(name: str | None, method: str, params: dict[str, str]) -> kmock.action | None:
    """The kmock action of a request, as kmock's own parser names it (PUT has none)."""
    if method == "GET" and params.get("watch") in {"true", "1"}:
        return kmock.action.WATCH
    verbs = (
        {"GET": "LIST", "POST": "CREATE"}
        if name is None
        else {"GET": "FETCH", "PATCH": "UPDATE", "DELETE": "DELETE"}
    )
    verb = verbs.get(method)
    return None if verb is None else kmock.action(verb)
