"""Statements counted at the client, by the name of the query they are.

A test that proves how many round trips a path costs wraps every cursor of its connections
(`Statements.cursor_class()` as the pool's `cursor_factory`), so any statement the store or
the runtime sends is seen, and named by the query it is (`other` for anything else).
"""

from __future__ import annotations

from typing import Any, Self

import psycopg
from psycopg.abc import Params, Query

from leasebox.db.queries import query, query_bytes, query_names


class Statements:
    """The statements sent through the wrapped connections, by query name."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        # A statement is sent as its `sql.Composed`, or as its bytes on the hot paths.
        self._names = {name: (query(name), query_bytes(name)) for name in query_names()}

    def name_of(self, statement: Query) -> str:
        for name, forms in self._names.items():
            if any(statement == form for form in forms):
                return name
        return "other"

    def cursor_class(self) -> type[psycopg.AsyncCursor[Any]]:
        statements = self

        class Counted(psycopg.AsyncCursor[Any]):
            async def execute(
                self,
                query: Any,  # psycopg's `Query`, which its own `execute` narrows
                params: Params | None = None,
                *,
                prepare: bool | None = None,
                binary: bool | None = None,
            ) -> Self:
                statements.sent.append(statements.name_of(query))
                return await super().execute(query, params, prepare=prepare, binary=binary)

        return Counted

    def take(self) -> list[str]:
        taken, self.sent = self.sent, []
        return taken
