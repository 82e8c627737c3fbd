"""Running a CRD's `x-kubernetes-validations` with a real CEL engine, as the API server does.

The API server first fills in the schema's defaults, then evaluates every rule at the node
that declares it, with `self` bound to the object's value there (the whole object, with
its metadata, at the root; each item for a rule under `items`). `validate` does the same
with `cel-python`, so the tests see the messages a user would: a rule that is false, or
that cannot be evaluated, is a failure.

This runs without a server, so the rules' logic is checked on every machine, Go or not; the
cluster tier (`tests/cluster/test_crd_on_the_server.py`) has the real API server judge the
same examples and agree with it case by case.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

Schema = dict[str, Any]


def apply_defaults(schema: Schema, value: Any) -> Any:
    """`value` with an OpenAPI schema's defaults filled in, recursively (a copy), as the API
    server defaults a custom resource before it validates it."""
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


@cache
def _program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def rules(schema: Schema, path: str = "") -> list[tuple[str, str]]:
    """Every (path, rule) the schema declares."""
    found = [(path or "<root>", r["rule"]) for r in schema.get("x-kubernetes-validations", [])]
    for name, sub in (schema.get("properties") or {}).items():
        found += rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += rules(schema[key], f"{path}[*]")
    return found


def _evaluate(schema: Schema, value: Any, path: str, failures: list[str]) -> None:
    for validation in schema.get("x-kubernetes-validations", []):
        try:
            result = _program(validation["rule"]).evaluate({"self": json_to_cel(value)})
        except Exception as exc:  # an evaluation error rejects the object too
            failures.append(f"{path or '<root>'}: {validation['message']} ({exc})")
            continue
        if not bool(result) or isinstance(result, CELEvalError):
            failures.append(f"{path or '<root>'}: {validation['message']}")
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                _evaluate(sub, value[name], f"{path}.{name}", failures)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _evaluate(schema["items"], item, f"{path}[{index}]", failures)


def validate(schema: Schema, obj: dict[str, Any]) -> list[str]:
    """The messages of every rule `obj` breaks (after defaulting); empty when it passes."""
    failures: list[str] = []
    _evaluate(schema, apply_defaults(schema, obj), "", failures)
    return failures
