"""The benchmarks' own SQL, kept in `bench/sql/bench.sql` and loaded by name.

The statements live in a `.sql` file for the same reasons as leasebox's queries (they can be
read and EXPLAINed as SQL), in the same format, loaded by leasebox's own loader, so the
schema name is always a quoted identifier.
"""

from __future__ import annotations

from psycopg import sql

from leasebox.db.queries import DEFAULT_SCHEMA, SqlFile, query

BENCH_SQL = SqlFile("bench", "bench.sql")


def bench_query(name: str, schema: str = DEFAULT_SCHEMA) -> sql.Composed:
    """The named statement of `bench.sql` for `schema`, ready to execute."""
    return query(name, schema, BENCH_SQL)
