"""Every Event and condition reason the operator uses is CamelCase and documented.

The reasons are read from the operator's source (the reason argument of every Event it
posts, and every problem reason), so a new reason cannot be added without a line in the
runbooks' table of Events.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "operator" / "leasebox_operator"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")  # UpperCamelCase; acronyms (SLA, DSN) stay
# Where the reason is among a call's positional arguments.
REASON_ARGUMENT = {"event": 1, "post_event": 2, "PollError": 1, "PoolProblem": 1,
                   "SecretError": 1}  # fmt: skip


def _reasons() -> set[str]:
    found: set[str] = set()
    for path in SOURCE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                index = REASON_ARGUMENT.get(name)
                if index is not None and len(node.args) > index:
                    argument = node.args[index]
                    options = [argument.body, argument.orelse] if isinstance(
                        argument, ast.IfExp) else [argument]  # fmt: skip
                    for option in options:
                        if isinstance(option, ast.Constant) and isinstance(option.value, str):
                            found.add(option.value)
            elif isinstance(node, ast.Assign) and path.name == "errors.py":
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id == "reason":
                    assert isinstance(node.value, ast.Constant)
                    found.add(str(node.value.value))
    return found - {"Problem"}  # the base class's placeholder


def _documented() -> set[str]:
    text = RUNBOOKS.read_text(encoding="utf-8")
    table = text.split("### Events and condition reasons", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([A-Z][A-Za-z]+)`", table))


def test_the_operator_uses_a_known_set_of_reasons() -> None:
    reasons = _reasons()
    assert {"ScaledUp", "ScaledDown", "Paused", "Resumed", "SchemaMissing", "SchemaReady",
            "InvalidSpec", "DatabaseUnreachable", "ConnectionFailed"} <= reasons  # fmt: skip


def test_every_reason_is_camel_case() -> None:
    assert sorted(r for r in _reasons() if not CAMEL.match(r)) == []


def test_every_reason_is_documented_in_the_runbooks() -> None:
    assert sorted(_reasons() - _documented()) == []
