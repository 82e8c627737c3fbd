"""Reading a statement's plan in tests: which relations it reads, and how.

The hot statements must stay on their indexes; a test EXPLAINs one over a seeded table and
asserts which indexes it uses and that it scans no table in full. A partitioned table has a
partition for each coming day, empty until its day: the planner rightly reads an empty
partition by a sequential scan (it costs nothing), so a scan counts as a full scan only
when the relation holds rows.
"""

from __future__ import annotations

import re
from typing import Any, LiteralString, cast

import psycopg
from psycopg import sql


def analyze(conn: psycopg.Connection[Any], *tables: str, schema: str = "leasebox") -> None:
    """Fresh statistics for `tables` (and their partitions), so that plans are the ones a
    table of that size gets; commits."""
    for table in tables:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, table)))
    if not conn.autocommit:
        conn.commit()


def plan_of(
    conn: psycopg.Connection[Any], statement: sql.Composable, params: dict[str, Any]
) -> Any:
    """The plan of `statement` with `params` (EXPLAIN's JSON, not executed); rolls back."""
    explain = sql.SQL("EXPLAIN (FORMAT JSON) ") + statement
    row = conn.execute(explain, params).fetchone()
    if not conn.autocommit:
        conn.rollback()
    assert row is not None
    return row[0][0]["Plan"]


def rescans(plan: Any) -> list[str]:
    """The CTE scans the plan runs once per row of something else: the inner side of a
    nested loop, or a subplan. A statement whose sets of rows are CTEs costs the product of
    their sizes when one of them is read that way."""
    found: list[str] = []

    def walk(node: dict[str, Any], per_row: bool) -> None:
        if per_row and node["Node Type"] == "CTE Scan":
            found.append(f"CTE Scan on {node['CTE Name']}")
        for child in node.get("Plans", []):
            relation = child.get("Parent Relationship")
            inner_loop = node["Node Type"] == "Nested Loop" and relation == "Inner"
            walk(child, per_row or inner_loop or relation == "SubPlan")

    walk(plan, False)
    return found


def nodes(plan: Any) -> list[dict[str, Any]]:
    """Every node of the plan, depth first."""
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found


def reads(plan: Any) -> set[str]:
    """How the plan reads each relation: `Seq Scan on queue`, `Index Scan using ...`."""
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        index = node.get("Index Name")
        if index:  # a bitmap index scan names its index and not its table
            found.add(f"{node['Node Type']} using {index}")
        elif "Relation Name" in node and node["Node Type"] != "ModifyTable":
            found.add(f"{node['Node Type']} on {node['Relation Name']}")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    return found


def full_scans(conn: psycopg.Connection[Any], plan: Any, *, schema: str = "leasebox") -> set[str]:
    """The sequential scans of the plan over relations that hold rows."""
    found = set()
    for read in reads(plan):
        if not read.startswith("Seq Scan on "):
            continue
        relation = read.removeprefix("Seq Scan on ")
        statement = sql.SQL("SELECT EXISTS (SELECT FROM {})").format(
            sql.Identifier(schema, relation)
        )
        row = conn.execute(statement).fetchone()
        if not conn.autocommit:
            conn.rollback()
        if row and row[0]:
            found.add(read)
    return found


def indexes(conn: psycopg.Connection[Any], plan: Any, *, schema: str = "leasebox") -> set[str]:
    """The indexes the plan reads, each day partition's index named by the partitioned
    table's index it belongs to (`outbox_20261202_pkey` is `outbox_pkey`)."""
    found = set()
    for read in reads(plan):
        _, using, index = read.partition(" using ")
        if not using:
            continue
        row = conn.execute(
            "SELECT c.relname FROM pg_catalog.pg_class AS c"
            " WHERE c.oid = pg_partition_root(to_regclass(%s))",
            (f'"{schema}"."{index}"',),
        ).fetchone()
        if not conn.autocommit:
            conn.rollback()
        found.add(str(row[0]) if row and row[0] else index)
    return found


# A worker's claim of a batch of 100 `otp` rows from the start of the ready index.
CLAIM_PARAMETERS: dict[str, Any] = {
    "kinds": ["otp"],
    "after_at": [None],
    "after_id": [None],
    "priorities": [0],
    "aging": [86400.0],
    "aged_limit": 0,
    "now": None,
    "limit": 100,
    "lease_seconds": 45,
    "worker_id": "w",
}

_PARAMETER = re.compile(r"%\((\w+)\)[sb]")


def generic_plan_of(
    conn: psycopg.Connection[Any], statement: sql.Composable, params: dict[str, Any]
) -> Any:
    """The plan the worker runs `statement` with: its generic plan, the one a prepared
    statement keeps under `plan_cache_mode = force_generic_plan` (the worker's setting),
    which does not know the parameters' values. Rolls back."""
    order: dict[str, int] = {}

    def number(found: re.Match[str]) -> str:
        return f"${order.setdefault(found.group(1), len(order) + 1)}"

    text = _PARAMETER.sub(number, statement.as_string(conn))
    conn.execute("SET plan_cache_mode = force_generic_plan")
    # The text is the product's own statement with its placeholders numbered: literal SQL.
    literal = sql.SQL(cast("LiteralString", text))  # type: ignore[redundant-cast]
    prepare = sql.SQL("PREPARE leasebox_generic AS {}").format(literal)
    conn.execute(prepare)
    values = sql.SQL(", ").join(sql.Literal(params[name]) for name in order)
    row = conn.execute(
        sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE leasebox_generic({})").format(values)
    ).fetchone()
    conn.execute("DEALLOCATE leasebox_generic")
    conn.execute("RESET plan_cache_mode")
    if not conn.autocommit:
        conn.rollback()
    assert row is not None
    return row[0][0]["Plan"]
