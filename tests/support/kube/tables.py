"""The `meta.k8s.io/v1` Table format that `kubectl get` asks for, from printer columns.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` and prints whatever
columns the server describes. For a custom resource the API server builds them from the
CRD's `additionalPrinterColumns`: a Name column, then each column's JSONPath evaluated on
the object (the first result only; strings printed as JSONPath prints them, integers and
numbers as numbers, dates as an age such as `5m`), then `Age` when the CRD names no
columns. Priority stays in the column definitions: kubectl shows priority 1 only with
`-o wide`. Built-in resources get the Name and Age columns.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from typing import Any

Body = dict[str, Any]
DEFAULT_COLUMNS = ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)
_FILTER = re.compile(r"^\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*['\"](.*)['\"]\)$")


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def _segments(path: str) -> list[str]:
    """`.status.conditions[?(@.type=="Ready")].status` -> names and bracket expressions."""
    parts: list[str] = []
    for match in re.finditer(r"\[([^\]]*)\]|\.?([^.\[]+)", path.strip()):
        parts.append(f"[{match.group(1)}]" if match.group(1) is not None else match.group(2))
    return parts


def find(obj: Any, path: str) -> list[Any]:
    """The results of a simple JSONPath: names, `[*]`, `[n]` and `[?(@.field=="value")]`."""
    current = [obj]
    for segment in _segments(path):
        found: list[Any] = []
        for value in current:
            if not segment.startswith("["):
                if isinstance(value, dict) and segment in value:
                    found.append(value[segment])
                continue
            inner = segment[1:-1]
            items = value if isinstance(value, list) else []
            if inner == "*":
                found.extend(items)
            elif inner.lstrip("-").isdigit():
                index = int(inner)
                if -len(items) <= index < len(items):
                    found.append(items[index])
            elif match := _FILTER.match(inner):
                field, wanted = match.groups()
                found.extend(item for item in items if find(item, "." + field)[:1] == [wanted])
        current = found
    return current


def human_age(timestamp: str, now: datetime.datetime | None = None) -> str:
    """An age as kubectl prints it: 45s, 5m30s, 3h, 12d."""
    moment = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int(((now or datetime.datetime.now(datetime.UTC)) - moment).total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 48:
        return f"{hours}h"
    return f"{days}d"


def _cell(column: Body, obj: Body) -> Any:
    results = find(obj, column["jsonPath"])
    if not results:
        return None
    value = results[0]
    kind = column.get("type", "string")
    if kind == "string":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if kind == "date":
        return human_age(str(value))
    if kind == "integer":
        return int(value)
    if kind == "number":
        return float(value)
    return value


def table(objects: Sequence[Body], columns: Sequence[Body] | None, resource_version: str) -> Body:
    """The Table of `objects` with the CRD's printer `columns` (None: a built-in's)."""
    chosen = list(columns) if columns else list(DEFAULT_COLUMNS)
    definitions = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                    "description": "Name of the object"}]  # fmt: skip
    definitions += [
        {
            "name": column["name"],
            "type": column.get("type", "string"),
            "format": column.get("format", ""),
            "description": column.get("description", ""),
            "priority": int(column.get("priority", 0)),
        }
        for column in chosen
    ]
    rows = [
        {
            "cells": [obj["metadata"]["name"], *(_cell(column, obj) for column in chosen)],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            },
        }
        for obj in objects
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
