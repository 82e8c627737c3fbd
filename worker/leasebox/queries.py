"""Named SQL, loaded from the `.sql` files shipped in the package.

SQL lives in files, not in Python strings, so that it can be read, reviewed and EXPLAINed as
SQL. The schema name is configurable, so each statement is composed with
`psycopg.sql.Identifier` (never string formatting) and cached per (name, schema).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString, cast

from psycopg import sql

from leasebox.errors import ConfigurationError

DEFAULT_SCHEMA = "leasebox"
QUERIES_FILE = "queries.sql"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NAME_LINE = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def validate_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain lower-case SQL identifier, else raise."""
    if not _IDENTIFIER.fullmatch(schema) or schema.startswith("pg_"):
        raise ConfigurationError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and underscores, "
            "starting with a letter or underscore, at most 63 characters, not starting with pg_"
        )
    return schema


def read_sql_file(relative_path: str) -> str:
    """The text of a `.sql` file shipped inside the package, e.g. ``migrations/0001_x.sql``."""
    return resources.files("leasebox").joinpath("sql", relative_path).read_text("utf-8")


@cache
def _named_queries(filename: str = QUERIES_FILE) -> dict[str, str]:
    text = read_sql_file(filename)
    parts = _NAME_LINE.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{filename} defines {name!r} twice")
        queries[name] = body.strip().rstrip(";")
    return queries


def query_names() -> list[str]:
    """Every query name defined in queries.sql."""
    return sorted(_named_queries())


def compose(text: str, schema: str) -> sql.Composed:
    """Compose trusted SQL text from the package with the schema as a quoted identifier."""
    # The text comes from files inside the package, never from input: it is literal SQL.
    template = sql.SQL(cast("LiteralString", text))  # type: ignore[redundant-cast]
    return template.format(schema=sql.Identifier(validate_schema_name(schema)))


@cache
def query(name: str, schema: str = DEFAULT_SCHEMA, filename: str = QUERIES_FILE) -> sql.Composed:
    """The named query for `schema`, ready to execute; `filename` picks another `.sql` file."""
    try:
        text = _named_queries(filename)[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in {filename}") from None
    return compose(text, schema)
