"""The producer's declaration of the templates agrees with the files the worker renders.

The producer refuses messages by the declaration (`leasebox.catalogue`), without Jinja2; the
worker renders the files. These tests prove the built-in declaration by rendering the built-in
files, and prove that the check shipped for applications' own tests
(`leasebox.testing.templates`) notices each way a declaration can drift from its files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from leasebox.catalogue import BUILTIN_TEMPLATES, BUILTIN_VARIABLES, Catalogue, template_names
from leasebox.delivery.rendering import BUILTIN_TEMPLATES_DIR
from leasebox.testing.templates import assert_templates_declared, template_disagreements


def write_template(root: Path, name: str, subject: str, text: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "subject.txt.j2").write_text(subject)
    (folder / "body.txt.j2").write_text(text)


def test_the_built_in_declaration_agrees_with_the_built_in_files() -> None:
    assert template_disagreements(catalogue=Catalogue()) == []
    assert_templates_declared(catalogue=Catalogue())


def test_every_built_in_template_directory_is_declared_and_every_variable_explained() -> None:
    assert template_names(BUILTIN_TEMPLATES_DIR) == sorted(spec.name for spec in BUILTIN_TEMPLATES)
    for spec in BUILTIN_TEMPLATES:
        assert spec.variables <= set(BUILTIN_VARIABLES), spec.name


@pytest.mark.parametrize(
    ("required", "optional", "problem"),
    [
        ((), ("name",), "welcome: reads 'link', not declared"),
        (("link", "name"), (), "welcome: renders without 'name', which it declares required"),
        (("link",), ("name", "team"), "welcome: declares 'team', which it never reads"),
    ],
    ids=["a variable read but not declared", "optional declared required", "stale variable"],
)
def test_the_check_names_each_way_a_declaration_drifts_from_its_files(
    tmp_path: Path, required: tuple[str, ...], optional: tuple[str, ...], problem: str
) -> None:
    write_template(
        tmp_path,
        "welcome",
        "Welcome",
        "Hi{% if name is defined %} {{ name }}{% endif %}, {{ link }}",
    )
    catalogue = Catalogue()
    catalogue.register_template("welcome", required=required, optional=optional)
    assert problem in template_disagreements(tmp_path, catalogue)
    with pytest.raises(AssertionError, match=problem):
        assert_templates_declared(tmp_path, catalogue)


def test_a_template_with_files_but_no_declaration_and_a_declaration_without_files_are_named(
    tmp_path: Path,
) -> None:
    write_template(tmp_path, "acme/welcome", "Welcome", "{{ link }}")
    catalogue = Catalogue()
    catalogue.register_template("digest", required=["issue"])
    assert template_disagreements(tmp_path, catalogue) == [
        "acme/welcome: has files, but is not declared (leasebox.register_template)",
        "digest: declared, but has no subject.txt.j2 and body.txt.j2",
    ]


def test_samples_stand_in_for_variables_a_string_does_not_suit(tmp_path: Path) -> None:
    write_template(tmp_path, "digest", "Issue {{ issue + 1 }}", "{{ items | join(', ') }}")
    catalogue = Catalogue()
    catalogue.register_template("digest", required=["issue", "items"])
    assert any("fails with" in p for p in template_disagreements(tmp_path, catalogue))
    samples = {"digest": {"issue": 7, "items": ["a", "b"]}}
    assert template_disagreements(tmp_path, catalogue, samples) == []


def test_an_override_of_a_built_in_is_checked_against_its_new_declaration(tmp_path: Path) -> None:
    write_template(tmp_path, "otp", "Your code for {{ product_name }}", "{{ name }}: {{ code }}")
    catalogue = Catalogue()
    assert (
        "otp: fails with only its required variables: template otp/subject.txt.j2 failed: "
        "variable 'product_name' is undefined" in template_disagreements(tmp_path, catalogue)
    )
    # The HTML body is still the built-in one (files are overridden one by one).
    catalogue.register_template(
        "otp", required=["code", "name", "product_name"], optional=["lang", "minutes_valid"]
    )
    assert template_disagreements(tmp_path, catalogue) == []
