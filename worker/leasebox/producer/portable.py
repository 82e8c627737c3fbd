"""Running a producer plan through a driver other than psycopg: the statements as text.

`leasebox.producer.plan` runs a plan on psycopg connections, whose queries are
`psycopg.sql.Composed` objects with `%(name)s` parameters. An ORM's connection may sit on
another DBAPI (SQLAlchemy over asyncpg) or on psycopg behind a cursor wrapper (Django), so
the adapters need the same statements as plain SQL text: `statement_text` renders a named
query with its schema quoted (the quoting needs no connection), and `named_binds` rewrites
its parameters into SQLAlchemy's `:name` form, which SQLAlchemy then compiles into whatever
paramstyle the engine's driver speaks. `drive` and `drive_async` feed each statement's
first row back into the plan, so every decision stays in the plan itself.

A plan of several steps holds its key's lock from the first to the last, so it needs a
transaction; on a connection in autocommit mode, which an adapter cannot open one on through
its ORM, such a plan is refused before its first statement. A plan of one final step is one
statement, atomic by itself, and runs there as anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any, TypeVar

from leasebox.db.queries import query
from leasebox.errors import ConfigurationError
from leasebox.producer.plan import Plan, Row, Step

T = TypeVar("T")
# Executes one named statement with its parameters; returns its first row by column name.
Execute = Callable[[str, dict[str, Any]], Row]
ExecuteAsync = Callable[[str, dict[str, Any]], Awaitable[Row]]

# `%(name)b` asks psycopg for the binary format; to any other driver it is a bind like the rest.
_PYFORMAT = re.compile(r"%\((\w+)\)[sb]")
_CAST_AFTER = re.compile(r"%\((\w+)\)([sb])(?=::)")
# A `:word` that SQLAlchemy's text() would take for a bind but is not one of ours (a cast
# such as `::text` is safe: text() skips double colons).
_STRAY_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


@cache
def statement_text(name: str, schema: str) -> str:
    """The named statement as SQL text with `%(name)s` parameters and the schema quoted."""
    return query(name, schema).as_string(None)


@cache
def named_binds(name: str, schema: str) -> tuple[str, frozenset[str]]:
    """The named statement with `:name` binds, and the names it binds.

    Raises `ValueError` when the text holds something text() would misread as a bind or a
    literal percent sign, so that a statement that cannot be translated faithfully fails
    loudly (a test runs every producer statement through this).
    """
    text = statement_text(name, schema)
    if _STRAY_BIND.search(text):
        raise ValueError(f"query {name!r} has a ':word' that would be read as a bind")
    names = frozenset(_PYFORMAT.findall(text))
    # `:name::type` would end the bind name at the cast for text(); a space keeps it a bind.
    translated = _PYFORMAT.sub(lambda m: f":{m.group(1)}", _CAST_AFTER.sub(r"%(\1)\2 ", text))
    if "%" in translated.replace("%%", ""):
        raise ValueError(f"query {name!r} has a parameter that is not %(name)s or %(name)b")
    return translated.replace("%%", "%"), names


def _check_transaction(first: Step, autocommit: bool) -> None:
    if autocommit and not first.final:
        raise ConfigurationError(
            "this enqueue runs several statements (an abuse guard's counts or a suppression "
            "check) that must share one transaction, and the connection is in AUTOCOMMIT: "
            "enqueue on a connection that opens transactions (SQLAlchemy's default), or "
            "without guard= and check_suppression="
        )


def drive(plan: Plan[T], execute: Execute, *, autocommit: bool = False) -> T:
    """Run `plan`, executing each statement of each step in order; return its result.

    `autocommit`: the connection commits every statement (a plan of several steps is refused).
    """
    try:
        step = next(plan)
        _check_transaction(step, autocommit)
        while True:
            row: Row = None
            for name, params in step.queries:
                row = execute(name, params)
            step = plan.send(row)
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(plan: Plan[T], execute: ExecuteAsync, *, autocommit: bool = False) -> T:
    """`drive` for a driver that is awaited."""
    try:
        step = next(plan)
        _check_transaction(step, autocommit)
        while True:
            row: Row = None
            for name, params in step.queries:
                row = await execute(name, params)
            step = plan.send(row)
    except StopIteration as done:
        result: T = done.value
        return result
