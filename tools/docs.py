"""`make docs`: the reference tables of the README and the chart's README, from the code.

A table written by hand drifts from the options the code takes; these are rendered from the
declarations the code itself reads, and a test (`tests/project/test_generated_docs.py`) fails
when a file differs from what this renders:

- the worker's settings, from `leasebox.config.OPTIONS` (what builds the flags);
- every provider URL option, from each provider's `UrlOption`s (what each one accepts);
- the built-in templates' variables, from `leasebox.catalogue` (what `enqueue` checks);
- `charts/leasebox/README.md`, from the `# --` comments of `values.yaml` (`tools.chart_docs`).

In the README each table sits between a `<!-- BEGIN GENERATED: name ... -->` line and an
`<!-- END GENERATED: name -->` line; the rest of the file is left as it is.

    python -m tools.docs           rewrite what is out of date
    python -m tools.docs --check   exit 1, naming the files, if anything is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from leasebox.catalogue import BUILTIN_TEMPLATES, BUILTIN_VARIABLES
from leasebox.config import OPTIONS, Option, Style
from leasebox.delivery.providers.registry import url_options
from tools.chart_docs import chart_readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CHART = ROOT / "charts" / "leasebox"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; a `|` inside a cell is escaped."""
    lines = [_row(header), "|" + "---|" * len(header)]
    lines += [_row(row) for row in rows]
    return "\n".join(lines) + "\n"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _default(option: Option[object]) -> str:
    if option.style is not Style.VALUE:
        return f"`{option.render(option.default)}`"
    if option.default is None or option.default == "":
        return "unset"
    return f"`{option.render(option.default)}`"


def worker_settings_table() -> str:
    """Every `leasebox worker` setting: its flag and variable, default and meaning."""
    rows = [
        (f"`{o.flag}` / `{o.variable}`", _default(o), o.help[:1].upper() + o.help[1:])
        for o in OPTIONS
    ]
    return table(("setting", "default", "meaning"), rows)


def provider_options_table() -> str:
    """Every option of every built-in provider URL, by the schemes that take it."""
    rows = [
        (", ".join(f"`{s}://`" for s in schemes), f"`{o.name}`", o.default, o.meaning)
        for schemes, options in url_options()
        for o in options
    ]
    return table(("URL", "option", "default", "meaning"), rows)


def template_variables_table() -> str:
    """Each variable of the built-in templates: required, optional or not read, per template."""
    specs = BUILTIN_TEMPLATES
    names = sorted(
        {v for spec in specs for v in spec.variables},
        key=lambda v: (not any(v in spec.required for spec in specs), v),
    )
    rows = []
    for name in names:
        cells = [
            "required" if name in spec.required else "optional" if name in spec.optional else ""
            for spec in specs
        ]
        rows.append((f"`{name}`", *cells, BUILTIN_VARIABLES[name]))
    header = ("variable", *(f"`{spec.name}`" for spec in specs), "meaning")
    return table(header, rows)


BLOCKS: dict[str, Callable[[], str]] = {
    "worker-settings": worker_settings_table,
    "provider-url-options": provider_options_table,
    "template-variables": template_variables_table,
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN GENERATED: {re.escape(name)} [^\n]*-->\n)(.*?)(<!-- END GENERATED: "
        rf"{re.escape(name)} -->)",
        re.DOTALL,
    )


def rendered_readme(text: str) -> str:
    """`text` (the README) with every generated block rendered anew."""
    for name, render in BLOCKS.items():
        found = _block(name).search(text)
        if found is None:
            raise ValueError(f"README.md has no generated block {name!r}")
        text = text[: found.start(2)] + render() + text[found.end(2) :]
    return text


def outputs() -> dict[Path, str]:
    """Each generated file and what it should hold."""
    return {
        README: rendered_readme(README.read_text("utf-8")),
        CHART / "README.md": chart_readme(CHART),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = {
        path: text
        for path, text in outputs().items()
        if not path.is_file() or path.read_text("utf-8") != text
    }
    for path, text in stale.items():
        if args.check:
            print(f"{path.relative_to(ROOT)} is out of date: run make docs", file=sys.stderr)
        else:
            path.write_text(text, "utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
