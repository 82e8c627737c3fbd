"""Server-side apply for the emulated API: field ownership by manager, as the API server keeps it.

The operator applies its children with `application/apply-patch+yaml` under one field
manager and changes replicas through `/scale`, so the emulator has to know who owns what:

* an object is seen as a tree of *fields*; lists whose items all carry a `name` (containers,
  env, volumes), `mountPath` (volumeMounts) or `containerPort` (ports) are *keyed*, their
  items addressed by key as `k:{"name":"worker"}`; every other list is one atomic value;
* an apply by manager M sets the fields of its configuration, takes them from their other
  owners when `force` is given (409 Conflict otherwise, for a field another manager set to
  a different value), and removes the fields M applied last time and leaves out now,
  unless another manager owns them too;
* any other write (create, merge patch, JSON patch, PUT, `/scale`) is an *Update*: its
  manager (`fieldManager`, else the client's user-agent) takes every field it changed;
* `metadata.managedFields` shows the result in the `FieldsV1` format.

This is the structured-merge subset the tests need, not all of it: no per-field list types
from an OpenAPI schema, no version conversion, and status writes are not tracked.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

Body = dict[str, Any]
Path = tuple[str, ...]
Owner = tuple[str, str]  # (manager, "Apply" | "Update")
APPLY, UPDATE = "Apply", "Update"
# Item fields that key a list; a list is keyed when every item is a dict holding the field.
LIST_KEYS = ("name", "mountPath", "containerPort")
UNTRACKED = frozenset({"status", "apiVersion", "kind"})
SERVER_METADATA = frozenset({
    "uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
    "deletionTimestamp", "deletionGracePeriodSeconds", "name", "namespace",
})  # fmt: skip


class ApplyConflict(Exception):
    """Fields another manager owns would change; `fields` names them."""

    def __init__(self, fields: list[str]) -> None:
        super().__init__(", ".join(fields))
        self.fields = fields


def _list_key(items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    return next((key for key in LIST_KEYS if all(key in item for item in items)), None)


def _segment(key: str, item: Body) -> str:
    return "k:" + json.dumps({key: item[key]}, separators=(",", ":"))


def leaves(value: Any, prefix: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every (path, value) of an object's fields; keyed list items are addressed by key."""
    if not prefix and not value:
        return
    if isinstance(value, dict) and value:
        for name, child in value.items():
            if not prefix and name in UNTRACKED:
                continue
            if prefix == ("f:metadata",) and name in SERVER_METADATA:
                continue
            yield from leaves(child, (*prefix, f"f:{name}"))
    elif isinstance(value, list) and (key := _list_key(value)):
        for item in value:
            yield from leaves(item, (*prefix, _segment(key, item)))
    else:
        yield prefix, value


def _child(node: Any, segment: str, create: bool) -> Any:
    """The child of a dict (`f:name`) or the keyed item of a list (`k:{...}`)."""
    if segment.startswith("f:"):
        if not isinstance(node, dict):
            return None
        if create and segment[2:] not in node:
            node[segment[2:]] = {}
        return node.get(segment[2:])
    ((field, wanted),) = json.loads(segment[2:]).items()
    for item in node if isinstance(node, list) else []:
        if isinstance(item, dict) and item.get(field) == wanted:
            return item
    if create and isinstance(node, list):
        node.append({field: wanted})
        return node[-1]
    return None


def get_field(obj: Body, path: Path) -> Any:
    node: Any = obj
    for segment in path:
        node = _child(node, segment, create=False)
        if node is None:
            return None
    return node


def set_field(obj: Body, path: Path, value: Any) -> None:
    node: Any = obj
    for index, segment in enumerate(path[:-1]):
        if segment.startswith("f:"):
            want: type = list if path[index + 1].startswith("k:") else dict
            if not isinstance(node.get(segment[2:]), want):
                node[segment[2:]] = want()
            node = node[segment[2:]]
        else:
            node = _child(node, segment, create=True)
    last = path[-1]
    if last.startswith("f:"):
        node[last[2:]] = copy.deepcopy(value)
    else:  # a keyed item without fields of its own
        _child(node, last, create=True)


def _is_key(path: Path) -> bool:
    """Whether a path ends at the key field of a keyed list item."""
    return len(path) >= 2 and path[-2].startswith("k:") and path[-1][2:] in json.loads(path[-2][2:])


def remove_field(obj: Body, path: Path) -> None:
    """Remove a field and the maps it leaves empty; a keyed item goes with its key field."""
    chain: list[Any] = [obj]
    for segment in path[:-1]:
        node = _child(chain[-1], segment, create=False)
        if node is None:
            return
        chain.append(node)
    parent = chain[-1]
    if _is_key(path):
        if not set(parent) - {path[-1][2:]}:  # nothing but the key is left
            chain[-2].remove(parent)
        return
    parent.pop(path[-1][2:], None)
    for depth in range(len(path) - 2, -1, -1):
        if chain[depth + 1] or not path[depth].startswith("f:"):
            return
        chain[depth].pop(path[depth][2:], None)


def fields_v1(paths: set[Path]) -> Body:
    """Owned paths in the `FieldsV1` format of `metadata.managedFields`."""
    tree: Body = {}
    for path in sorted(paths):
        node = tree
        for segment in path:
            node = node.setdefault(segment, {})
            if segment.startswith("k:"):
                node.setdefault(".", {})
    return tree


class FieldOwnership:
    """Who owns which fields of one object."""

    def __init__(self) -> None:
        self.owners: dict[Owner, set[Path]] = {}

    def record_update(self, manager: str, old: Body | None, new: Body) -> None:
        """An Update by `manager`: it takes every field whose value it changed or added."""
        before = dict(leaves(old or {}))
        changed = {path for path, value in leaves(new) if before.get(path, ...) != value}
        self._take((manager, UPDATE), changed)
        alive = {path for path, _ in leaves(new)}
        kept = {owner: paths & alive for owner, paths in self.owners.items()}
        self.owners = {owner: paths for owner, paths in kept.items() if paths}

    def apply(self, current: Body, config: Body, manager: str, *, force: bool) -> Body:
        """The object after `manager` applies `config` (raises `ApplyConflict` without force)."""
        applied = dict(leaves(config))
        if not force:
            conflicts = sorted(
                ".".join(s[2:] if s.startswith("f:") else s for s in path)
                for path, value in applied.items()
                if get_field(current, path) not in (None, value)
                and any(path in paths for (who, _), paths in self.owners.items() if who != manager)
            )
            if conflicts:
                raise ApplyConflict(conflicts)
        result = copy.deepcopy(current)
        previous = self.owners.get((manager, APPLY), set())
        others = set().union(*(p for o, p in self.owners.items() if o != (manager, APPLY)))
        gone = previous - set(applied)
        for path in sorted(gone, key=lambda p: (_is_key(p), -len(p))):
            if path not in others:
                remove_field(result, path)
        for path, value in applied.items():
            set_field(result, path, value)
        self._take((manager, APPLY), set(applied))
        self.owners[(manager, APPLY)] = set(applied)
        return result

    def _take(self, owner: Owner, paths: set[Path]) -> None:
        for other in self.owners:
            if other != owner:
                self.owners[other] -= paths
        self.owners.setdefault(owner, set()).update(paths)
        self.owners = {o: p for o, p in self.owners.items() if p}

    def managed_fields(self, api_version: str) -> list[Body]:
        return [
            {
                "manager": manager,
                "operation": operation,
                "apiVersion": api_version,
                "fieldsType": "FieldsV1",
                "fieldsV1": fields_v1(paths),
            }
            for (manager, operation), paths in sorted(self.owners.items())
        ]
