"""The kinds and templates a message may name, declared where the producer can check them.

A message with a kind no one registered, a template that does not exist or without a
variable its template needs used to be accepted and then dead-lettered by the worker long
after the API had answered. The producer cannot read the templates to know better: they are
Jinja2 files, and `pip install leasebox` must not need Jinja2. So the producer checks a
declaration instead: each template's name, the variables it needs and the ones it may use.

The built-in templates are declared here (a test renders them to prove the declaration
right). An application declares its own beside the files it adds, with `register_template`
and `register_kind`, and proves its declaration with `leasebox.testing`'s
`assert_templates_declared`, which renders its files the same way. `enqueue` and
`enqueue_many` check every message against a `Catalogue` (the process-wide one unless given
another) and refuse, with one line naming the field, before any SQL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from leasebox.errors import ConfigurationError, InvalidMessage
from leasebox.messages import BUILTIN_KINDS, KIND_PATTERN, TEMPLATE_PATTERN, OutboxMessage

# The files of a template, as the worker's renderer looks for them.
SUBJECT_FILE = "subject.txt.j2"
TEXT_FILE = "body.txt.j2"
HTML_FILE = "body.html.j2"


@dataclass(frozen=True)
class TemplateSpec:
    """A template's name, the variables it cannot render without, and the ones it may use.

    A message gives its variables in `data` or `secrets` (one namespace); `required` ones
    must be there, `optional` ones change the email when they are (a name in the greeting).
    """

    name: str
    required: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()

    @property
    def variables(self) -> frozenset[str]:
        return self.required | self.optional


# What each variable of the built-in templates means, for the documentation.
BUILTIN_VARIABLES: Mapping[str, str] = MappingProxyType(
    {
        "code": "the one-time code (give it in `secrets`)",
        "link": "the address the button and the plain link open",
        "inviter": "who invites, as the recipient knows them",
        "name": "the recipient's name, for the greeting (`Hi Ada,`)",
        "team_name": "what the recipient is invited to",
        "minutes_valid": "how long the code or link works, in minutes",
        "product_name": "your product's name, in the subject, the text and the HTML header",
        "lang": "the HTML part's `lang` attribute (default `en`)",
    }
)
_COMMON = frozenset({"name", "minutes_valid", "product_name", "lang"})
BUILTIN_TEMPLATES: tuple[TemplateSpec, ...] = (
    TemplateSpec("otp", frozenset({"code"}), _COMMON),
    TemplateSpec("verification", frozenset({"link"}), _COMMON),
    TemplateSpec("password_reset", frozenset({"link"}), _COMMON),
    TemplateSpec("invite", frozenset({"inviter", "link"}), _COMMON | {"team_name"}),
)


def template_names(directory: Path) -> list[str]:
    """The templates under `directory`: each folder with a subject and a text body, named
    by its path below `directory` (`otp`, `acme/welcome`), in order."""
    if not directory.is_dir():
        raise ConfigurationError(f"templates directory {str(directory)!r} does not exist")
    names = []
    for subject in sorted(directory.rglob(SUBJECT_FILE)):
        name = subject.parent.relative_to(directory).as_posix()
        if (subject.parent / TEXT_FILE).is_file() and re.fullmatch(TEMPLATE_PATTERN, name):
            names.append(name)
    return names


def _identifier(name: str, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigurationError(f"{what} {name!r} is not a valid variable name")
    return name


class Catalogue:
    """The kinds and templates messages may name; checks a message against them.

    Starts with the built-ins (`otp`, `verification`, `password_reset`, `invite`, each a kind
    and a template of that name). Registering a template under a name already known replaces
    its declaration, for a deployment that overrides a built-in and needs more of it.
    """

    def __init__(
        self,
        templates: Iterable[TemplateSpec] = BUILTIN_TEMPLATES,
        kinds: Iterable[str] = BUILTIN_KINDS,
    ) -> None:
        self._templates = {spec.name: spec for spec in templates}
        self._kinds = set(kinds)

    def __repr__(self) -> str:
        return f"Catalogue(kinds={sorted(self._kinds)}, templates={sorted(self._templates)})"

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self._kinds)

    @property
    def templates(self) -> Mapping[str, TemplateSpec]:
        return MappingProxyType(dict(self._templates))

    def register_kind(self, name: str) -> None:
        """Let messages of kind `name` be enqueued (a pool of workers must claim it)."""
        if not isinstance(name, str) or not re.fullmatch(KIND_PATTERN, name):
            raise ConfigurationError(
                f"kind {name!r} is not valid: a lower-case letter, then lower-case letters, "
                "digits or '_'"
            )
        self._kinds.add(name)

    def register_template(
        self, name: str, *, required: Iterable[str] = (), optional: Iterable[str] = ()
    ) -> TemplateSpec:
        """Declare template `name` (a directory of the worker's `--templates`) and its
        variables: `required` ones a message must give, `optional` ones it may."""
        if not isinstance(name, str) or not re.fullmatch(TEMPLATE_PATTERN, name):
            raise ConfigurationError(f"template name {name!r} is not valid")
        if isinstance(required, str) or isinstance(optional, str):
            raise ConfigurationError("required and optional are lists of variable names")
        needed = frozenset(_identifier(v, "required variable") for v in required)
        allowed = frozenset(_identifier(v, "optional variable") for v in optional)
        both = sorted(needed & allowed)
        if both:
            raise ConfigurationError(
                f"template {name!r} declares {both[0]!r} both required and optional"
            )
        spec = TemplateSpec(name, needed, allowed)
        self._templates[name] = spec
        return spec

    def register_directory(self, directory: Path) -> list[str]:
        """Declare every template under `directory` (a worker's `--templates`) that is not
        declared yet, with no variables known; return their names.

        For the command line, which has the files but no declaration: a missing template is
        then refused at enqueue, a missing variable only by the worker.
        """
        found = [name for name in template_names(directory) if name not in self._templates]
        for name in found:
            self._templates[name] = TemplateSpec(name)
        return found

    def template(self, name: str) -> TemplateSpec | None:
        return self._templates.get(name)

    def check(self, message: OutboxMessage) -> None:
        """Refuse `message` if its kind or template is not registered, or it lacks a variable
        its template requires: `InvalidMessage`, naming the first such field."""
        if message.kind not in self._kinds:
            raise InvalidMessage(
                "kind",
                f"{message.kind!r} is not a registered kind (known: "
                f"{', '.join(sorted(self._kinds))}); declare it with "
                f"leasebox.register_kind({message.kind!r})",
            )
        spec = self._templates.get(message.template)
        if spec is None:
            raise InvalidMessage(
                "template",
                f"{message.template!r} is not a registered template (known: "
                f"{', '.join(sorted(self._templates))}); declare it with "
                f"leasebox.register_template({message.template!r}, required=[...])",
            )
        missing = sorted(spec.required.difference(message.data, message.secrets))
        if missing:
            raise InvalidMessage(
                missing[0],
                f"the {spec.name!r} template needs this variable; give it in data or secrets",
                others=missing[1:],
            )

    def check_all(self, messages: Iterable[OutboxMessage]) -> None:
        """`check` for a batch: refuse it if any message fails, naming each by position."""
        refused: list[str] = []
        first: InvalidMessage | None = None
        for index, message in enumerate(messages):
            try:
                self.check(message)
            except InvalidMessage as exc:
                first = first or exc
                refused.append(f"messages[{index}].{exc.field}")
        if first is not None:
            raise InvalidMessage(refused[0], first.problem, others=refused[1:])


# The catalogue `enqueue` checks against unless it is given another.
DEFAULT_CATALOGUE = Catalogue()


def default_catalogue() -> Catalogue:
    """The process-wide catalogue, looked up at each call (a test may replace it)."""
    return DEFAULT_CATALOGUE


def register_kind(name: str) -> None:
    """`Catalogue.register_kind` on the process-wide catalogue."""
    default_catalogue().register_kind(name)


def register_template(
    name: str, *, required: Iterable[str] = (), optional: Iterable[str] = ()
) -> TemplateSpec:
    """`Catalogue.register_template` on the process-wide catalogue."""
    return default_catalogue().register_template(name, required=required, optional=optional)
