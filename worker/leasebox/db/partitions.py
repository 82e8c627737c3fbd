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

Receipts live in the partition of the day they expire, so a producer with a long receipt
TTL writes to a day far ahead: the receipts' days are made as far ahead of the farthest day
holding receipts as the others are of today, so that the TTLs in use are followed.

The statements here are DDL, which takes no bind parameters: identifiers are composed with
`sql.Identifier` and days with `sql.Literal`, never with string formatting. Concurrent
maintenance (several pods) serialises on one advisory lock per schema. The exclusive locks
that attaching and dropping need are taken first, before anything is moved (a row written to
the default partition between a move and the attach failed the attach), and briefly
(`lock_briefly`): each try waits a fraction of a second, shorter than PostgreSQL's deadlock
timeout, and gives everything back before the next, so that the upkeep never stalls
producers for long and never holds a lock while a deadlock check could pick a producer as
its victim. Each day of each table is a step of its own: one that fails (a lock another
transaction holds too long) leaves the others done, and `PartitionsIncomplete` says which.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from leasebox.db.queries import DEFAULT_SCHEMA, validate_schema_name
from leasebox.errors import DatabaseError

PARTITIONED_TABLES = ("outbox", "history", "receipts")
# Days of partitions kept ready ahead of today (and of the farthest day holding receipts).
DAYS_AHEAD = 7
# How long the upkeep and retention wait, in all, for the exclusive locks they need.
LOCK_TIMEOUT = "2s"
LOCK_WAIT_SECONDS = 2.0
# The longest one try for those locks waits: half the server's deadlock timeout at most, so
# that no one waiting behind it runs its deadlock check before it gives the locks back.
LOCK_TRY_SECONDS = 0.2
# Tables whose rows may belong to a day far ahead (a receipt expiring in a month).
_FOLLOWED = frozenset({"receipts"})
# The bucket of the messages retention keeps, after every real day: the `<table>_kept`
# partitions of the outbox and the history, which retention never drops.
KEPT_DAY = date(9999, 12, 31)
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


class LocksUnavailable(DatabaseError):
    """Other transactions held a lock the upkeep needs for longer than it waits."""


@dataclass(frozen=True)
class PartitionFailure:
    """A step of the upkeep that failed: the table, the days it left unmade, and why."""

    table: str
    days: tuple[date, ...]
    reason: str

    def describe(self) -> str:
        first, last = self.days[0], self.days[-1]
        span = f"{first}" if first == last else f"{first} to {last}"
        return f"{self.table} {span} ({self.reason})"


class PartitionsIncomplete(DatabaseError):
    """Some partitions could not be made; every other step of the upkeep was done.

    The rows of a day without its partition wait in the default partition, and the next
    upkeep tries again. `created` are the partitions made, `failures` what was not.
    """

    def __init__(self, created: Sequence[Partition], failures: Sequence[PartitionFailure]):
        described = "; ".join(f.describe() for f in failures)
        super().__init__(
            f"could not make every partition: {described}; their rows wait in the default "
            "partition, and the next upkeep tries again"
        )
        self.created = list(created)
        self.failures = list(failures)


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

    Every table gets a partition for each day from `today` to `today + ahead` (the receipts
    to `ahead` days past the farthest day holding receipts, which follows the longest TTL
    in use), and for each day whose rows wait in its default partition (moved there and out
    of the default). Each partition is created and committed in a transaction of its own, so
    `conn` must not be inside a transaction. A step that fails leaves the others done:
    `PartitionsIncomplete` then names what is missing.
    """
    validate_schema_name(schema)
    first = today or database_today(conn)
    if not conn.autocommit:
        conn.commit()
    created: list[Partition] = []
    failures: list[PartitionFailure] = []
    for table in PARTITIONED_TABLES:
        waiting = _days_in_default(conn, table, schema)
        last = first + timedelta(days=ahead)
        if table in _FOLLOWED:
            holding = _farthest_day_holding_rows(conn, table, schema)
            farthest = max([*waiting, *([holding] if holding else [])], default=first)
            last = max(last, farthest + timedelta(days=ahead))
        wanted = {first + timedelta(days=n) for n in range((last - first).days + 1)}
        existing = list_partitions(conn, table, schema)
        if not conn.autocommit:
            conn.commit()
        missing = sorted(d for d in {*wanted, *waiting} if not any(p.holds(d) for p in existing))
        for n, day in enumerate(missing):
            try:
                made = _create_day(conn, table, schema, day)
            except LocksUnavailable as exc:
                # Every later day of the table needs the same lock: they wait for a later run.
                failures.append(PartitionFailure(table, tuple(missing[n:]), str(exc)))
                break
            except psycopg.Error as exc:
                reason = f"{type(exc).__name__}: {_first_line(exc)}"
                failures.append(PartitionFailure(table, (day,), reason))
                continue
            if made is not None:
                created.append(made)
    if failures:
        raise PartitionsIncomplete(created, failures)
    return created


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _days_in_default(conn: psycopg.Connection[Any], table: str, schema: str) -> list[date]:
    statement = sql.SQL("SELECT DISTINCT bucket FROM {}").format(
        sql.Identifier(schema, f"{table}_default")
    )
    days = [row[0] for row in conn.execute(statement).fetchall()]
    if not conn.autocommit:
        conn.commit()
    return days


def _farthest_day_holding_rows(
    conn: psycopg.Connection[Any], table: str, schema: str
) -> date | None:
    """The day of the farthest day partition of `table` that holds a row (None if all are
    empty): what the producers' longest TTL reaches. Looked for from the farthest day back,
    one row each."""
    days = [p for p in list_partitions(conn, table, schema) if _one_day(p)]
    found = None
    for partition in sorted(days, key=lambda p: p.start or date.min, reverse=True):
        statement = sql.SQL("SELECT EXISTS (SELECT FROM {})").format(
            sql.Identifier(schema, partition.name)
        )
        row = conn.execute(statement).fetchone()
        if row and row[0]:
            found = partition.start
            break
    if not conn.autocommit:
        conn.commit()
    return found


def _one_day(partition: Partition) -> bool:
    start, end = partition.start, partition.end
    return start is not None and end is not None and end == start + timedelta(days=1)


def _create_day(
    conn: psycopg.Connection[Any], table: str, schema: str, day: date
) -> Partition | None:
    """Create the partition of `table` for `day` unless a partition holds it already.

    The parent and its default partition are locked before anything is moved: attaching
    checks that the default holds no row of the day, and a producer writing one there
    between the move and the attach would fail it.
    """
    name = day_partition_name(table, day)
    parent = sql.Identifier(schema, table)
    default = sql.Identifier(schema, f"{table}_default")
    target = sql.Identifier(schema, name)
    start, end = sql.Literal(day), sql.Literal(day + timedelta(days=1))
    with conn.transaction():
        _serialise(conn, schema)
        if any(p.holds(day) for p in list_partitions(conn, table, schema)):
            return None
        lock_briefly(
            conn,
            [
                sql.SQL("LOCK TABLE ONLY {} IN SHARE UPDATE EXCLUSIVE MODE").format(parent),
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(default),
            ],
            what=f"{table}_default",
        )
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


def lock_briefly(
    conn: psycopg.Connection[Any],
    statements: Sequence[sql.Composed],
    *,
    what: str,
    within: float = LOCK_WAIT_SECONDS,
) -> None:
    """Run `statements` (LOCK TABLE ...) in the caller's transaction, in short tries.

    Each try waits at most `LOCK_TRY_SECONDS` (or half the server's deadlock timeout, if
    shorter) for all of them, then gives back what it took and, after a short pause, tries
    again, until `within` seconds have passed: then `LocksUnavailable`. A request for an
    exclusive lock queues every later reader and writer behind it, so it must not wait long;
    and a try that holds one table while waiting for the next never waits long enough for a
    transaction waiting on it to run its deadlock check and give up instead.
    """
    row = conn.execute(
        "SELECT current_setting('statement_timeout'),"
        " (SELECT setting::float8 FROM pg_catalog.pg_settings WHERE name = 'deadlock_timeout')"
    ).fetchone()
    previous, deadlock_ms = (str(row[0]), float(row[1])) if row else ("0", 1000.0)
    attempt_ms = max(10, int(min(LOCK_TRY_SECONDS * 1000, deadlock_ms / 2)))
    deadline = time.monotonic() + within
    while True:
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT set_config('statement_timeout', %s, true)", (f"{attempt_ms}ms",)
                )
                for statement in statements:
                    conn.execute(statement)
        except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable):
            if time.monotonic() >= deadline:
                raise LocksUnavailable(
                    f"another transaction is using {what} (it held a lock for over {within:g}s)"
                ) from None
            time.sleep(random.uniform(0.02, 0.08))
            continue
        conn.execute("SELECT set_config('statement_timeout', %s, true)", (previous,))
        return


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
