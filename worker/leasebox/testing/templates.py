"""A check for an application's tests: its template declaration agrees with its files.

The producer refuses a message by the declaration (`leasebox.register_template`), and the
worker renders it by the files; a declaration that says less than the files lets a message
through that the worker then dead-letters, and one that says more refuses good messages.
`assert_templates_declared` renders the files to prove the declaration, as leasebox's own
tests do for the built-in templates.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from leasebox.catalogue import Catalogue, default_catalogue, template_names
from leasebox.delivery.rendering import BUILTIN_TEMPLATES, TemplateRenderer


def template_disagreements(
    templates_dir: Path | None = None,
    catalogue: Catalogue | None = None,
    samples: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """Every way `catalogue` (default: the process-wide one) disagrees with the templates
    of `templates_dir` and the built-ins: one line each, empty when they agree.

    A template with files and no declaration, a declared one without files, a variable read
    but not declared, or declared but never read, a required variable the template renders
    without, and a template that fails with its declared variables. `samples` gives, per
    template, values for variables that the string "x" does not suit (a list, a number).
    """
    chosen = default_catalogue() if catalogue is None else catalogue
    renderer = TemplateRenderer(templates_dir)
    with_files = set(BUILTIN_TEMPLATES)
    if templates_dir is not None:
        with_files.update(template_names(templates_dir))
    problems = [
        f"{name}: has files, but is not declared (leasebox.register_template)"
        for name in sorted(with_files - set(chosen.templates))
    ]
    for name, spec in sorted(chosen.templates.items()):
        problems += renderer.disagreements(spec, (samples or {}).get(name))
    return problems


def assert_templates_declared(
    templates_dir: Path | None = None,
    catalogue: Catalogue | None = None,
    samples: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Fail (`AssertionError`, one line per problem) unless the declaration agrees with the
    files; see `template_disagreements`."""
    problems = template_disagreements(templates_dir, catalogue, samples)
    if problems:
        raise AssertionError(
            "the template declaration disagrees with the files:\n" + "\n".join(problems)
        )
