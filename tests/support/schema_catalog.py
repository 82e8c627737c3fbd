"""A comparable description of a schema, read from the PostgreSQL catalogs.

Used to prove that the ordered migrations build exactly the canonical `schema.sql`: tables
and partitioned tables with their columns, constraints, indexes and storage, the partitions
with their bounds, views, sequences, triggers and functions.
"""

from __future__ import annotations

from typing import Any

import psycopg

CATALOG_QUERIES = {
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %(schema)s AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relkind IN ('r', 'p', 'v') AND c.relname <> 'schema_migrations'
        ORDER BY 1, 2""",
    "constraints": """
        SELECT c.relname, pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname <> 'schema_migrations'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = %(schema)s AND tablename <> 'schema_migrations'
        ORDER BY 1""",
    "reloptions": """
        SELECT c.relname, c.reloptions FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p')
          AND c.relname <> 'schema_migrations'
        ORDER BY 1""",
    "partitions": """
        SELECT p.relname, c.relname, pg_get_expr(c.relpartbound, c.oid)
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        JOIN pg_namespace n ON n.oid = p.relnamespace
        WHERE n.nspname = %(schema)s AND p.relkind = 'p'
        ORDER BY 1, 2""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relkind = 'v'
        ORDER BY 1""",
    "sequences": """
        SELECT c.relname, s.seqtypid::regtype::text, d.refobjid::regclass::text
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_sequence s ON s.seqrelid = c.oid
        LEFT JOIN pg_depend d ON d.objid = c.oid AND d.deptype = 'a'
        WHERE n.nspname = %(schema)s
        ORDER BY 1""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND NOT t.tgisinternal
        ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s
        ORDER BY 1""",
}


def describe_schema(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: [tuple(row) for row in conn.execute(text, {"schema": schema}).fetchall()]
        for name, text in CATALOG_QUERIES.items()
    }
