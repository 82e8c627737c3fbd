"""ARCHITECTURE.md names exactly the packages that exist, and every module it points to."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "worker" / "leasebox"
DOC = (ROOT / "ARCHITECTURE.md").read_text("utf-8")


def _subpackages() -> set[str]:
    return {
        str(init.parent.relative_to(SOURCE)).replace("\\", "/")
        for init in SOURCE.rglob("__init__.py")
        if init.parent != SOURCE and "__pycache__" not in init.parts
    }


def test_every_package_of_leasebox_is_on_the_map() -> None:
    named = set(re.findall(r"^  ([a-z_]+)/", DOC, flags=re.MULTILINE))
    top_level = {package.split("/")[0] for package in _subpackages()}
    assert named == top_level


def test_every_module_path_the_message_walk_names_exists() -> None:
    paths = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.(?:py|sql))", DOC))
    assert paths, "the walk through one message names no modules"
    missing = sorted(p for p in paths if not (SOURCE / p).is_file() and not (ROOT / p).is_file())
    assert missing == []


def test_every_nested_package_is_mentioned() -> None:
    nested = {p for p in _subpackages() if "/" in p}
    for package in nested:
        assert package.split("/")[-1] + "/" in DOC, f"{package} is not on the map"
