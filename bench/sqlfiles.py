"""The benchmarks' own SQL, kept in `bench/sql/bench.sql` and loaded by name.

The statements live in a `.sql` file for the same reasons as leasebox's queries (they can be
read and EXPLAINed as SQL), and are composed with leasebox's `compose`, so the schema name is
always a quoted identifier.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from psycopg import sql

from leasebox.queries import DEFAULT_SCHEMA, compose

SQL_FILE = Path(__file__).resolve().parent / "sql" / "bench.sql"
_NAME_LINE = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@cache
def _statements() -> dict[str, str]:
    parts = _NAME_LINE.split(SQL_FILE.read_text("utf-8"))
    return {
        name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


@cache
def bench_query(name: str, schema: str = DEFAULT_SCHEMA) -> sql.Composed:
    """The named statement of `bench.sql` for `schema`, ready to execute."""
    try:
        text = _statements()[name]
    except KeyError:
        raise KeyError(f"no statement named {name!r} in {SQL_FILE.name}") from None
    return compose(text, schema)
