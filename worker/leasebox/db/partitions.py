"""Daily partitions of what leasebox keeps after sending: created ahead, dropped by retention.

`outbox`, `history` and `receipts` are partitioned by a `bucket` day, so that retention
drops a day of them at once (a catalog change) instead of deleting a million rows and their
index entries one by one. Partitions must exist before rows arrive, so they are created ahead
of time: by `migrate`, by every worker once an hour, and by `leasebox prune`. Whatever
arrives for a day without a partition lands in the table's default partition, so a producer's
write never fails for want of one; the next maintenance moves those rows into a partition of
their own day, so that the default partition stays empty and attaching a new day stays a
catalog change, not a scan.

A partition is any range of days: `<table>_YYYYMMDD` holds one day, and migration 0004 put
everything written before it into one `<table>_legacy` partition, which retention drops as a
whole once its last day is past the retention.

The statements here are DDL, which takes no bind parameters: identifiers are composed with
`sql.Identifier` and days with `sql.Literal`, never with string formatting. Concurrent
maintenance (several pods) serialises on one advisory lock per schema; attaching and
dropping wait at most `LOCK_TIMEOUT` for the brief exclusive locks they need, so that they
never stall producers for longer, and a maintenance that times out is retried later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from leasebox.db.queries import DEFAULT_SCHEMA, validate_schema_name
from leasebox.errors import DatabaseError

PARTITIONED_TABLES = ("outbox", "history", "receipts")
# Days of partitions kept ready ahead of today (and of a receipt's expiry day).
DAYS_AHEAD = 7
LOCK_TIMEOUT = "2s"
_BOUNDS = re.compile(r"^FOR VALUES FROM \((.+)\) TO \((.+)\)$")
_DAY = re.compile(r"^'(\d{4}-\d{2}-\d{2})'$")
# Per-table storage of a new partition: rows are written once (receipts count reuses in
# place, and those columns carry no index, so the update stays on its page).
_STORAGE: dict[str, LiteralString] = {
    "outbox": "fillfactor = 100",
    "history": "fillfactor = 100",
    "receipts": "fillfactor = 90",
}
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('leasebox.partitions.' || %s, 0))"


@dataclass(frozen=True, order=True)
class Partition:
    """One partition: the days `[start, end)` it holds (None: unbounded, or the default)."""

    table: str
    name: str
    start: date | None
    end: date | None
    default: bool = False

    def holds(self, day: date) -> bool:
        if self.default:
            return False
        return (self.start is None or self.start <= day) and (self.end is None or day < self.end)


def day_partition_name(table: str, day: date) -> str:
    """`outbox_20261202`: the name of the partition of `table` holding `day` alone."""
    return f"{table}_{day:%Y%m%d}"


def database_today(conn: psycopg.Connection[Any]) -> date:
    """Today in UTC on the database's clock: the day a row written now gets."""
    row = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()
    if row is None:
        raise DatabaseError("the database returned no row for today's date")
    day: date = row[0]
    return day


def list_partitions(
    conn: psycopg.Connection[Any], table: str, schema: str = DEFAULT_SCHEMA
) -> list[Partition]:
    """The partitions of `schema.table`, the default one included, in order of their days."""
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)"
        " FROM pg_catalog.pg_inherits AS i"
        " JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = to_regclass(%s)",
        (f'"{validate_schema_name(schema)}"."{table}"',),
    ).fetchall()
    found = [_partition(table, str(name), str(bound)) for name, bound in rows]
    return sorted(found, key=lambda p: (p.default, p.start or date.min))


def _partition(table: str, name: str, bound: str) -> Partition:
    if bound == "DEFAULT":
        return Partition(table, name, None, None, default=True)
    match = _BOUNDS.match(bound)
    if match is None:
        raise ValueError(f"partition {name} of {table} has bounds leasebox cannot read: {bound}")
    return Partition(table, name, _bound_day(match.group(1)), _bound_day(match.group(2)))


def _bound_day(text: str) -> date | None:
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    match = _DAY.match(text)
    if match is None:
        raise ValueError(f"a partition bound leasebox cannot read: {text}")
    return date.fromisoformat(match.group(1))


def ensure_partitions(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    *,
    today: date | None = None,
    ahead: int = DAYS_AHEAD,
) -> list[Partition]:
    """Create the day partitions that are missing; return the ones created.

    Every table gets a partition for each day from `today` to `today + ahead`, and for each
    day whose rows wait in its default partition (moved there and out of the default).
    Each partition is created and committed in a transaction of its own, so `conn` must not
    be inside a transaction.
    """
    validate_schema_name(schema)
    first = today or database_today(conn)
    if not conn.autocommit:
        conn.commit()
    wanted = [first + timedelta(days=n) for n in range(ahead + 1)]
    created = []
    for table in PARTITIONED_TABLES:
        for day in sorted({*wanted, *_days_in_default(conn, table, schema)}):
            made = _create_day(conn, table, schema, day)
            if made is not None:
                created.append(made)
    return created


def _days_in_default(conn: psycopg.Connection[Any], table: str, schema: str) -> list[date]:
    statement = sql.SQL("SELECT DISTINCT bucket FROM {}").format(
        sql.Identifier(schema, f"{table}_default")
    )
    days = [row[0] for row in conn.execute(statement).fetchall()]
    if not conn.autocommit:
        conn.commit()
    return days


def _create_day(
    conn: psycopg.Connection[Any], table: str, schema: str, day: date
) -> Partition | None:
    """Create the partition of `table` for `day` unless a partition holds it already."""
    name = day_partition_name(table, day)
    parent = sql.Identifier(schema, table)
    default = sql.Identifier(schema, f"{table}_default")
    target = sql.Identifier(schema, name)
    start, end = sql.Literal(day), sql.Literal(day + timedelta(days=1))
    with conn.transaction():
        _serialise(conn, schema)
        if any(p.holds(day) for p in list_partitions(conn, table, schema)):
            return None
        bound_lock_waits(conn)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH ({})"
            ).format(target, parent, sql.SQL(_STORAGE[table]))
        )
        # Rows that arrived before the day had a partition wait in the default one.
        conn.execute(
            sql.SQL(
                "WITH moved AS (DELETE FROM {} WHERE bucket >= {} AND bucket < {} RETURNING *)"
                " INSERT INTO {} SELECT * FROM moved"
            ).format(default, start, end, target)
        )
        conn.execute(
            sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
                parent, target, start, end
            )
        )
    return Partition(table, name, day, day + timedelta(days=1))


def drop_partitions(
    conn: psycopg.Connection[Any], partitions: Iterable[Partition], schema: str = DEFAULT_SCHEMA
) -> None:
    """Drop `partitions` (none of them a default one) in the caller's transaction."""
    bound_lock_waits(conn)
    for partition in partitions:
        if partition.default:
            raise ValueError(f"{partition.name} is a default partition; it is never dropped")
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, partition.name)))


def bound_lock_waits(conn: psycopg.Connection[Any]) -> None:
    """Make every lock the caller's transaction waits for from now on wait `LOCK_TIMEOUT` at
    most (then `LockNotAvailable`): a request for an exclusive lock that waits queues every
    later reader and writer of the table behind it."""
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))


def _serialise(conn: psycopg.Connection[Any], schema: str) -> None:
    """Wait for any other maintenance of `schema`'s partitions, until the transaction ends."""
    conn.execute(_LOCK, (schema,))


def serialise_maintenance(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> None:
    """`_serialise` for the callers that drop partitions (retention), in their transaction."""
    _serialise(conn, validate_schema_name(schema))


def default_partition_rows(
    conn: psycopg.Connection[Any], table: str, schema: str = DEFAULT_SCHEMA
) -> int:
    """How many rows wait in `table`'s default partition (zero once maintenance has run)."""
    statement = sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(validate_schema_name(schema), f"{table}_default")
    )
    row = conn.execute(statement).fetchone()
    return int(row[0]) if row else 0
