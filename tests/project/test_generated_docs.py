"""The reference tables are what the code declares: `make docs` would change nothing.

The README's worker settings, provider URL options and template variables, and the chart's
README, are rendered by `tools/docs.py` from the declarations the code reads; a change to an
option, a provider, a template or `values.yaml` without `make docs` fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tools.chart_docs import documented_values
from tools.docs import CHART, README, main, outputs

from leasebox.config import OPTIONS
from leasebox.delivery.providers.registry import BUILTIN_SCHEMES, url_options


@pytest.mark.parametrize("path", [README, CHART / "README.md"], ids=["README", "chart README"])
def test_the_generated_file_is_what_make_docs_renders(path: Path) -> None:
    assert path.read_text("utf-8") == outputs()[path], "run make docs"


def test_the_check_passes_on_the_files_as_they_are() -> None:
    assert main(["--check"]) == 0


def test_every_worker_flag_and_variable_is_in_the_readme() -> None:
    text = README.read_text("utf-8")
    for option in OPTIONS:
        assert f"`{option.flag}` / `{option.variable}`" in text


def test_every_built_in_scheme_has_its_options_in_the_reference() -> None:
    documented = {scheme for schemes, _ in url_options() for scheme in schemes}
    assert documented == set(BUILTIN_SCHEMES)


def test_every_value_of_the_chart_is_documented() -> None:
    values = documented_values(CHART / "values.yaml")
    assert {v.path for v in values} >= {"image.tag", "operator.replicas", "tests.enabled"}
    assert all(v.description for v in values)


def test_a_value_without_a_description_is_an_error_naming_it(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("# -- Documented.\nimage:\n  # -- The tag.\n  tag: ''\n  digest: ''\n")
    with pytest.raises(ValueError, match=r"line 5: image\.digest has no '# --' description"):
        documented_values(values)


def test_a_default_tag_and_a_continued_description_are_read(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "# -- Replicas of the thing,\n# more than one for peering.\n# @default -- one\n"
        "replicas: 1\n# -- Drops.\ndrop:\n  - ALL\n"
    )
    found = [(v.path, v.kind, v.default, v.description) for v in documented_values(values)]
    assert found == [
        ("replicas", "int", "one", "Replicas of the thing, more than one for peering."),
        ("drop", "list", '`["ALL"]`', "Drops."),
    ]
