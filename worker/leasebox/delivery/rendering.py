"""Rendering an outbox row into subject, text and HTML, with templates a deployment can replace.

Templates are Jinja2 files, `<name>/subject.txt.j2`, `<name>/body.txt.j2` and optionally
`<name>/body.html.j2`. A templates directory overrides the built-ins file by file, so a
deployment can restyle the HTML of `otp` and keep the rest. Undefined variables are errors
(`StrictUndefined`): an email that says "Your code is ." is worse than a dead letter.

A rendering error names the template file and the error's class, plus, for a missing
variable, that variable's name, taken from the template's own source. It never carries
the exception's message: Jinja2 and filters quote the values they choke on, and a value
may be the code itself or any transformation of it (`{{ lookup[code | reverse] }}`), which
no masking of the exact value could catch.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import jinja2
import jinja2.meta
import jinja2.nodes

from leasebox import catalogue
from leasebox.catalogue import HTML_FILE, SUBJECT_FILE, TEXT_FILE, TemplateSpec
from leasebox.errors import TemplateError

BUILTIN_TEMPLATES_DIR = Path(__file__).parent / "templates"
# The names the producer's catalogue declares, so that the two cannot list different ones.
BUILTIN_TEMPLATES = tuple(spec.name for spec in catalogue.BUILTIN_TEMPLATES)
_TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*(/[a-z0-9][a-z0-9_\-]*)*$")
_MISSING_NAME = re.compile(r"^'([A-Za-z_][A-Za-z0-9_]*)' is undefined$")


@dataclass(frozen=True)
class RenderedEmail:
    """What a template produced; none of it shows in a repr, since it may hold the code."""

    subject: str = field(repr=False)
    text: str = field(repr=False)
    html: str | None = field(repr=False)


@dataclass(frozen=True, slots=True)
class _Files:
    """The compiled files of one template."""

    subject: jinja2.Template
    text: jinja2.Template
    html: jinja2.Template | None


def _environment(loader: jinja2.BaseLoader, *, autoescape: bool) -> jinja2.Environment:
    # Plain-text bodies are not HTML: escaping would turn "O'Brien" into "O&#39;Brien".
    return jinja2.Environment(
        loader=loader,
        autoescape=autoescape,  # noqa: S701
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        auto_reload=False,
        # Unbounded (a plain dict): templates are files of one directory, and Jinja's LRU
        # cache pays a lock and a linear scan of its queue on every lookup.
        cache_size=-1,
    )


class TemplateRenderer:
    """Renders templates from `templates_dir` first, then from the built-ins.

    A template's files are compiled once, on first use. Each message's variables make one
    dictionary, beside Jinja's globals, that the subject, text and HTML contexts share
    (`Template.render` would copy the globals and the variables into a new one per file).
    """

    def __init__(self, templates_dir: Path | None = None) -> None:
        if templates_dir is not None and not templates_dir.is_dir():
            raise TemplateError(f"templates directory {str(templates_dir)!r} does not exist")
        self.templates_dir = templates_dir
        search = [BUILTIN_TEMPLATES_DIR] if templates_dir is None else [templates_dir]
        if templates_dir is not None:
            search.append(BUILTIN_TEMPLATES_DIR)
        self._loader = jinja2.FileSystemLoader([str(path) for path in search])
        self._text = _environment(self._loader, autoescape=False)
        self._html = _environment(self._loader, autoescape=True)
        self._globals = dict(self._text.globals)
        self._files: dict[str, _Files] = {}

    def __repr__(self) -> str:
        return f"TemplateRenderer(templates_dir={self.templates_dir!r})"

    def render(
        self, template: str, data: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> RenderedEmail:
        """Subject, text and HTML of `template`; secrets and data share one namespace."""
        files = self._files.get(template)
        if files is None:
            files = self._compile(template)
        context: dict[str, Any] = {**self._globals, **data, **secrets}
        subject = self._render(self._text, files.subject, context)
        text = self._render(self._text, files.text, context)
        html = None if files.html is None else self._render(self._html, files.html, context)
        # A subject is one header line; a newline in it would start a new header.
        return RenderedEmail(subject=" ".join(subject.split()), text=text, html=html)

    def has_template(self, template: str) -> bool:
        """Whether `template` has at least a subject and a text body."""
        try:
            self._load(self._text, template, SUBJECT_FILE)
            self._load(self._text, template, TEXT_FILE)
        except TemplateError:
            return False
        return True

    def disagreements(
        self, spec: TemplateSpec, samples: Mapping[str, Any] | None = None
    ) -> list[str]:
        """How the declaration `spec` disagrees with the template's files; empty if it agrees.

        The variables the files read come from their source and from every file they extend,
        import or include. The declaration is then proved by rendering: with its required
        variables only and with all of them (each must render), and with each required one
        left out (each must fail). Values are `samples`, else the string "x".
        """
        if not self.has_template(spec.name):
            return [f"{spec.name}: declared, but has no {SUBJECT_FILE} and {TEXT_FILE}"]
        problems = []
        read = self._variables_read(spec.name)
        problems += [
            f"{spec.name}: reads {v!r}, not declared" for v in sorted(read - spec.variables)
        ]
        problems += [
            f"{spec.name}: declares {v!r}, which it never reads"
            for v in sorted(spec.variables - read)
        ]
        values = {name: (samples or {}).get(name, "x") for name in spec.variables}
        for label, given in (("only its required", spec.required), ("all its", spec.variables)):
            try:
                self.render(spec.name, {name: values[name] for name in given}, {})
            except TemplateError as exc:
                problems.append(f"{spec.name}: fails with {label} variables: {exc}")
        for name in sorted(spec.required):
            try:
                self.render(spec.name, {v: values[v] for v in spec.required - {name}}, {})
            except TemplateError:
                continue
            problems.append(f"{spec.name}: renders without {name!r}, which it declares required")
        return problems

    def _variables_read(self, template: str) -> set[str]:
        """Every variable the template's files, and the files they use, read from a message."""
        pending = [f"{template}/{file}" for file in (SUBJECT_FILE, TEXT_FILE, HTML_FILE)]
        seen: set[str] = set()
        read: set[str] = set()
        while pending:
            path = pending.pop()
            if path in seen:
                continue
            seen.add(path)
            try:
                source, _, _ = self._loader.get_source(self._text, path)
            except jinja2.TemplateNotFound:
                continue  # the HTML body is optional
            parsed = self._text.parse(source)
            # A block is analysed as a scope of its own, blind to the file's imports.
            imported = {node.target for node in parsed.find_all(jinja2.nodes.Import)}
            for node in parsed.find_all(jinja2.nodes.FromImport):
                imported |= {name if isinstance(name, str) else name[1] for name in node.names}
            read |= jinja2.meta.find_undeclared_variables(parsed) - imported
            pending += [name for name in jinja2.meta.find_referenced_templates(parsed) if name]
        return read - set(self._globals)

    def _compile(self, template: str) -> _Files:
        if not _TEMPLATE_NAME.fullmatch(template):
            raise TemplateError(f"template name {template!r} is not valid")
        files = _Files(
            subject=self._load(self._text, template, SUBJECT_FILE),
            text=self._load(self._text, template, TEXT_FILE),
            html=self._load(self._html, template, HTML_FILE, required=False),
        )
        self._files[template] = files
        return files

    @overload
    @staticmethod
    def _load(environment: jinja2.Environment, template: str, file: str) -> jinja2.Template: ...

    @overload
    @staticmethod
    def _load(
        environment: jinja2.Environment, template: str, file: str, *, required: bool
    ) -> jinja2.Template | None: ...

    @staticmethod
    def _load(
        environment: jinja2.Environment, template: str, file: str, *, required: bool = True
    ) -> jinja2.Template | None:
        path = f"{template}/{file}"
        try:
            return environment.get_template(path)
        except jinja2.TemplateNotFound:
            if not required:
                return None
            where = "the templates directory or the built-ins"
            raise TemplateError(f"template {template!r} has no {file} in {where}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"template {path} has a syntax error on line {exc.lineno}: {exc.message}"
            ) from None

    @staticmethod
    def _render(
        environment: jinja2.Environment, compiled: jinja2.Template, context: dict[str, Any]
    ) -> str:
        try:
            # What `compiled.render(context)` does, on the shared variables instead of a copy
            # (and without walking the template's chain of globals, which they hold already).
            scope = environment.context_class(environment, context, compiled.name, compiled.blocks)
            return "".join(compiled.root_render_func(scope))
        except jinja2.UndefinedError as exc:
            name = _missing_variable(exc, _source_names(environment, compiled), context)
            if name is not None:
                raise TemplateError(
                    f"template {compiled.name} failed: variable {name!r} is undefined"
                ) from None
            raise TemplateError(f"template {compiled.name} failed: UndefinedError") from None
        except Exception as exc:  # its message may quote a value, so keep only the type
            raise TemplateError(f"template {compiled.name} failed: {type(exc).__name__}") from None


def _source_names(environment: jinja2.Environment, compiled: jinja2.Template) -> set[str]:
    """The variables the template's source reads from its context (names, never values)."""
    if environment.loader is None or compiled.name is None:
        return set()
    try:
        source, _, _ = environment.loader.get_source(environment, compiled.name)
        return set(jinja2.meta.find_undeclared_variables(environment.parse(source)))
    except jinja2.TemplateError:
        return set()


def _missing_variable(
    exc: jinja2.UndefinedError, names: Collection[str], context: Mapping[str, Any]
) -> str | None:
    """The name of the missing top-level variable, if that is what failed and the name is one
    the template's source reads; None otherwise (the message then says nothing more)."""
    found = _MISSING_NAME.fullmatch(exc.message or "")
    if found is None:
        return None
    name = found.group(1)
    return name if name in names and name not in context else None
