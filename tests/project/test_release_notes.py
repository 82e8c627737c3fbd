"""The changelog names the release this tree builds, with the chart at the same version.

`## [Unreleased]` stays on top for what comes next; the first version below it is the one in
`leasebox/version.py` (what the wheel, the image and `leasebox --version` say), dated, and the
chart's `version` and `appVersion` follow it.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from leasebox.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_the_changelog_has_unreleased_on_top_then_this_version_dated() -> None:
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text("utf-8"), re.MULTILINE)
    assert headings[0] == "[Unreleased]"
    assert re.fullmatch(rf"\[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}", headings[1])


def test_the_chart_is_at_the_version_of_the_release() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "leasebox" / "Chart.yaml").read_text("utf-8"))
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)
