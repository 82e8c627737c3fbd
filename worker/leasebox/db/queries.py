"""Named SQL, loaded from `.sql` files by name and composed with the schema as an identifier.

SQL lives in files, not in Python strings, so that it can be read, reviewed and EXPLAINed as
SQL. A file is a sequence of named statements, each with a one-line description:

    -- name: claim
    -- Lease up to a batch of ready rows of some kinds, oldest first.
    WITH candidates AS (...)

Predicates that several statements share are written once, as a fragment, and included by a
line of their own:

    -- fragment: dead_letter_selection
    o.status = 'dead' AND ...

    -- name: count_dead_letters
    -- How many dead letters match a selection.
    SELECT count(*) FROM {schema}.outbox AS o WHERE
    -- include: dead_letter_selection

The schema name is configurable, so each statement is composed with `psycopg.sql.Identifier`
(never string formatting) and cached per (file, name, schema). Comments are the reader's: a
statement goes out without them (`compact`), under its name. The NOTIFY channel is defined
here once and composed into the trigger and the LISTEN statement.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import LiteralString, cast

from psycopg import sql

from leasebox.errors import ConfigurationError

DEFAULT_SCHEMA = "leasebox"
# Every schema's trigger notifies this one channel with its schema name as the payload.
NOTIFY_CHANNEL = "leasebox_outbox"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_HEADER = re.compile(r"^-- (name|fragment): ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^\s*-- include: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_DESCRIPTION = re.compile(r"^-- (?!include:)(\S.*)$")


def validate_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain lower-case SQL identifier, else raise."""
    if not _IDENTIFIER.fullmatch(schema) or schema.startswith("pg_"):
        raise ConfigurationError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and underscores, "
            "starting with a letter or underscore, at most 63 characters, not starting with pg_"
        )
    return schema


@dataclass(frozen=True)
class SqlFile:
    """A `.sql` file shipped in a package's `sql/` folder, e.g. ``SqlFile("leasebox.db")``."""

    package: str
    name: str = "queries.sql"

    def read(self) -> str:
        return resources.files(self.package).joinpath("sql", self.name).read_text("utf-8")


@dataclass(frozen=True)
class NamedQuery:
    """One statement of a file: its name, what it does, and its SQL with fragments included."""

    name: str
    description: str
    text: str


CORE = SqlFile("leasebox.db")


def read_sql_file(relative_path: str, package: str = "leasebox.db") -> str:
    """The text of a `.sql` file shipped in `package`, e.g. ``migrations/0001_initial.sql``."""
    return SqlFile(package, relative_path).read()


@cache
def named_queries(source: SqlFile = CORE) -> dict[str, NamedQuery]:
    """Every named statement of `source`, by name."""
    parts = _HEADER.split(source.read())
    fragments: dict[str, str] = {}
    raw: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        found = fragments if kind == "fragment" else raw
        if name in found:
            raise ValueError(f"{source.name} defines the {kind} {name!r} twice")
        found[name] = body.strip().rstrip(";")

    def include(match: re.Match[str]) -> str:
        try:
            fragment = fragments[match.group(1)]
        except KeyError:
            raise ValueError(
                f"{source.name} includes an unknown fragment {match.group(1)!r}"
            ) from None
        return _INCLUDE.sub(include, fragment)  # a fragment may include another

    queries = {}
    for name, body in raw.items():
        first, _, rest = body.partition("\n")
        described = _DESCRIPTION.fullmatch(first.strip())
        if described is None:
            raise ValueError(f"{source.name}: query {name!r} lacks its one-line description")
        try:
            text = compact(_INCLUDE.sub(include, rest))
        except ValueError as exc:
            raise ValueError(f"{source.name}: query {name!r}: {exc}") from None
        queries[name] = NamedQuery(name, described.group(1), f"/* leasebox {name} */\n{text}")
    return queries


def compact(text: str) -> str:
    """SQL text as it is sent: without its comment lines, blank lines and indentation.

    The comments are for the reader of the file. On the wire they would only lengthen the
    statement, and psycopg parses a statement longer than 4,096 bytes again on every
    execution instead of caching it (a claim, with its comments, is about 7,000 bytes). The
    statement keeps its name in a leading comment, for `pg_stat_statements` and the
    server's log. A string that spans lines would be changed, so it is refused.
    """
    kept = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("--"):
            continue
        if line.count("'") % 2 or "$$" in line:
            raise ValueError(f"a string spans lines, which compacting would change: {line}")
        kept.append(line)
    return "\n".join(kept)


def query_names(source: SqlFile = CORE) -> list[str]:
    """Every statement name defined in `source`."""
    return sorted(named_queries(source))


def compose(text: str, schema: str) -> sql.Composed:
    """Compose trusted SQL text from the package with the schema as a quoted identifier."""
    # The text comes from files inside the packages, never from input: it is literal SQL.
    template = sql.SQL(cast("LiteralString", text))  # type: ignore[redundant-cast]
    return template.format(
        schema=sql.Identifier(validate_schema_name(schema)),
        notify_channel=sql.Literal(NOTIFY_CHANNEL),
        notify_channel_name=sql.Identifier(NOTIFY_CHANNEL),
    )


@cache
def query(name: str, schema: str = DEFAULT_SCHEMA, source: SqlFile = CORE) -> sql.Composed:
    """The named statement of `source` (leasebox's own queries by default) for `schema`."""
    try:
        text = named_queries(source)[name].text
    except KeyError:
        raise KeyError(f"no query named {name!r} in {source.name}") from None
    return compose(text, schema)


@cache
def query_bytes(name: str, schema: str = DEFAULT_SCHEMA, source: SqlFile = CORE) -> bytes:
    """The named statement as UTF-8 bytes, composed once: for the hot paths, where composing
    the `sql.Composed` again on every execution costs more than the statement's own work."""
    return query(name, schema, source).as_bytes(None)


def text_array(values: Iterable[str | None]) -> str:
    """A `text[]` literal of `values` (None is NULL), for a batch statement's text column
    (`%(name)s::text[]`).

    psycopg packs a list element by element in Python (about 38 µs for the 100 provider ids
    of a settled batch, in the binary format); this literal takes 3 when no value holds a
    double quote or a backslash, as ids and keys almost never do, and quotes each element
    otherwise. Every element is quoted, so that no text reads as NULL or as a separator.
    """
    texts = list(values)
    if None not in texts:
        joined = '","'.join(cast("list[str]", texts))
        if joined.count('"') == 2 * (len(texts) - 1) and "\\" not in joined:
            return '{"' + joined + '"}'
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in texts
        )
        + "}"
    )
