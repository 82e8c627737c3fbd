"""The chart's README, rendered from the comments of its `values.yaml` (helm-docs' style).

Each value is documented by a `# -- ` comment right above its key (continued by the `#`
lines that follow it); `# @default -- TEXT` says what the default is when the literal value
would not (an empty tag that means "the chart's appVersion"). Every key must have one: a
value without a description is an error, not a gap in the table. helm-docs itself is a Go
program; this is the small part of it the chart needs, kept with the project so that
`make docs` needs nothing else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-]+):(?:\s|$)")
_DESCRIPTION = re.compile(r"^\s*# -- ?(?P<text>.*)$")
_DEFAULT = re.compile(r"^\s*# @default -- ?(?P<text>.*)$")
_CONTINUATION = re.compile(r"^\s*#(?: (?P<text>.*))?$")


@dataclass(frozen=True)
class Value:
    """One documented key of `values.yaml`."""

    path: str
    kind: str
    default: str
    description: str


def documented_values(values_file: Path) -> list[Value]:
    """Every key of `values_file` with its type, default and description, in file order.

    Raises `ValueError` naming the first key that has no `# --` description.
    """
    text = values_file.read_text("utf-8")
    loaded = yaml.safe_load(text) or {}
    found: list[Value] = []
    stack: list[tuple[int, str]] = []
    description: list[str] | None = None
    default: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            description, default = None, None
            continue
        if stripped.startswith("#"):
            if (matched := _DEFAULT.match(line)) is not None:
                default = matched["text"].strip()
            elif (matched := _DESCRIPTION.match(line)) is not None:
                description = [matched["text"].strip()]
            elif description is not None and (matched := _CONTINUATION.match(line)):
                description.append((matched["text"] or "").strip())
            continue
        key = _KEY.match(line)
        if key is None or stripped.startswith("- "):
            continue  # the items of a list belong to their key
        indent = len(key["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key["key"]))
        path = ".".join(name for _, name in stack)
        if not description:
            raise ValueError(f"values.yaml line {number}: {path} has no '# --' description")
        value = _lookup(loaded, [name for _, name in stack])
        found.append(
            Value(path, _kind(value), default or _literal(value), " ".join(description).strip())
        )
        description, default = None, None
    return found


def _lookup(values: Any, path: list[str]) -> Any:
    for name in path:
        values = values[name]
    return values


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "string"


def _literal(value: Any) -> str:
    if isinstance(value, dict) and value:
        return "the keys below"
    return f"`{json.dumps(value)}`"


def chart_readme(chart: Path) -> str:
    """The chart's README: what it installs, how, and every value."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text("utf-8"))
    description = " ".join(str(meta["description"]).split())
    rows = [
        f"| `{v.path}` | {v.kind} | {v.default} | {v.description.replace('|', chr(92) + '|')} |"
        for v in documented_values(chart / "values.yaml")
    ]
    return "\n".join(
        [
            f"# {meta['name']}",
            "",
            "<!-- Generated from values.yaml and Chart.yaml by `make docs` (tools/chart_docs.py);",
            "     edit those, not this file. A test fails when this file is out of date. -->",
            "",
            description,
            "",
            f"Chart version `{meta['version']}`, app version `{meta['appVersion']}`, "
            f"Kubernetes `{meta['kubeVersion']}`.",
            "",
            "```sh",
            f"helm install {meta['name']} charts/{meta['name']} --namespace leasebox "
            "--create-namespace",
            "```",
            "",
            "The walkthrough on a real cluster is `docs/kubernetes.md`; the upgrade order and",
            "the versions that may run together are in `docs/upgrading.md`.",
            "",
            "## Values",
            "",
            "| key | type | default | description |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
