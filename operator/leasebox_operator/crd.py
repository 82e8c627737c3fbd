"""The `OutboxWorkerPool` CRD, generated from the pydantic models.

Kubernetes accepts only *structural* schemas: no `$ref`, a type on every node, no
`additionalProperties: false` beside `properties`, no `uniqueItems`, OpenAPI 3.0 boolean
`exclusiveMinimum`. pydantic emits JSON Schema 2020-12, so this module rewrites it: it
inlines references, folds `Optional` into a plain field, turns numeric exclusive bounds
into the boolean form and drops titles. `leasebox crd` prints the result and a test keeps
`crds/` equal to it.
"""

from __future__ import annotations

from typing import Any

import yaml

from leasebox_operator.models import (
    GROUP,
    KIND,
    PLURAL,
    POOL_RULES,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    PoolSpec,
    PoolStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
_DROPPED = frozenset({"title", "$defs"})

READY_STATUS = '.status.conditions[?(@.type=="Ready")]'
# As cert-manager shows certificates: the summary first, details with `-o wide`.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Kinds", "type": "string", "jsonPath": ".status.kinds",
     "description": "Message kinds the pool claims"},
    {"name": "Ready", "type": "string", "jsonPath": f"{READY_STATUS}.status",
     "description": "Whether the pool works: database, schema and workers"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas",
     "description": "Replicas requested on the worker Deployment"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas",
     "description": "Replicas the scaling policy asks for", "priority": 1},
    {"name": "Pending", "type": "integer", "jsonPath": ".status.backlog.pending",
     "description": "Pending messages"},
    {"name": "Oldest", "type": "integer", "jsonPath": ".status.backlog.oldestPendingAgeSeconds",
     "description": "Age in seconds of the oldest pending message"},
    {"name": "SLA", "type": "integer", "jsonPath": ".spec.sla.oldestPendingAgeSeconds",
     "description": "Oldest pending age in seconds the pool is scaled to keep"},
    {"name": "Dead", "type": "integer", "jsonPath": ".status.backlog.dead",
     "description": "Dead letters", "priority": 1},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.scaling.mode",
     "description": "Who sizes the pool: Operator or External", "priority": 1},
    {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused",
     "description": "Whether the workers are held at zero (spec.paused)", "priority": 1},
    {"name": "Status", "type": "string", "jsonPath": f"{READY_STATUS}.message",
     "description": "Why the pool is (not) ready", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)  # fmt: skip
SCALE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a `$ref`, keeping the referring node's own keys (description, default)."""
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return _resolve(merged, defs)


def _fold_optional(node: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [X, {type: null}]` becomes X; an optional field is simply left out."""
    variants = node.get("anyOf")
    if not variants or node.get("x-kubernetes-int-or-string"):
        return node
    rest = [v for v in variants if v != {"type": "null"}]
    if len(rest) != 1:
        return node
    folded = {**rest[0], **{k: v for k, v in node.items() if k != "anyOf"}}
    if folded.get("default", ...) is None:
        del folded["default"]
    return folded


def structural(node: Any, defs: dict[str, Any], *, keep_defaults: bool = True) -> Any:
    """Rewrite one pydantic JSON-schema node into a structural OpenAPI v3 schema node."""
    if isinstance(node, list):
        return [structural(item, defs, keep_defaults=keep_defaults) for item in node]
    if not isinstance(node, dict):
        return node
    node = _resolve(_fold_optional(_resolve(node, defs)), defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and not keep_defaults):
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {
                name: structural(prop, defs, keep_defaults=keep_defaults)
                for name, prop in value.items()
            }
        elif key in ("items", "additionalProperties", "anyOf"):
            out[key] = structural(value, defs, keep_defaults=keep_defaults)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" in out and not out.get("required"):
        out.pop("required", None)
    if out.get("default") == {} and "properties" in out:
        out["default"] = _filled(out)
    return out


def _filled(node: dict[str, Any]) -> dict[str, Any]:
    """What a section's `default: {}` becomes once its own fields' defaults apply.

    The API server fills an absent section with its default and then the defaults inside
    it, but it checks the section's CEL rules against the default as written when it
    accepts the CRD: a rule such as `self.minReplicas <= self.maxReplicas` over a bare `{}`
    has no such key, and the CRD is refused. So the default is written filled in.
    """
    return {name: prop["default"] for name, prop in node["properties"].items() if "default" in prop}


def _model_schema(model: type[PoolSpec] | type[PoolStatus], *, keep_defaults: bool) -> Any:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return structural(schema, schema.get("$defs", {}), keep_defaults=keep_defaults)


def openapi_schema() -> dict[str, Any]:
    """The `openAPIV3Schema` of the resource: spec with defaults, status without."""
    status = _model_schema(PoolStatus, keep_defaults=False)
    return {
        "type": "object",
        "description": PoolSpec.__doc__ or KIND,
        "required": ["spec"],
        "x-kubernetes-validations": [rule.as_validation() for rule in POOL_RULES],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _model_schema(PoolSpec, keep_defaults=True),
            "status": status,
        },
    }


def custom_resource_definition() -> dict[str, Any]:
    """The whole CRD manifest."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {
                "app.kubernetes.io/name": "leasebox",
                "app.kubernetes.io/part-of": "leasebox",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["leasebox"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": dict(SCALE)},
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML document `leasebox crd` prints and `crds/` holds."""
    header = "# Generated by `leasebox crd` from leasebox_operator.models; do not edit.\n"
    return header + yaml.safe_dump(
        custom_resource_definition(), sort_keys=False, width=100, allow_unicode=True
    )
