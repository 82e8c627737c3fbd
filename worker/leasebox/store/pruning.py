"""Retention: dropping the days of messages, history and receipts older than a retention.

What is kept after sending is partitioned by day (`leasebox.db.partitions`), so retention
drops a whole day at once: a catalog change that takes milliseconds, where deleting a day
of a busy outbox row by row (a million messages, two million history rows, their receipts
and every index entry) took seconds and left the tables to vacuum. A day's partition is
dropped once all of it is older than the retention: messages and history by the day the
message was created, receipts by the day they expire (a receipt goes a retention after it
expired).

Some messages of an old day are still wanted: those not sent yet or dead (still in the
queue), and those a live receipt names (a retried request must still map onto its send).
They are moved to today's partition first, with their history, in the same transaction as
the drop, which holds the tables whose partitions it drops (so no request can name one of
their messages meanwhile). Rows of days that never had a partition wait in a default
partition: the partition maintenance that runs first gives each such day its partition, so
they go too.

The provider events received before the same day go too, deleted in batches (with the hourly
counts, which the reputation rates read for a week).

A retention shorter than the producers' receipt TTL is refused unless the caller says it
knows: a request retried after its message was dropped is a new request, and sends again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import psycopg
from psycopg import sql

from leasebox.db.partitions import (
    LOCK_TIMEOUT,
    PARTITIONED_TABLES,
    Partition,
    bound_lock_waits,
    drop_partitions,
    ensure_partitions,
    list_partitions,
    serialise_maintenance,
)
from leasebox.db.queries import DEFAULT_SCHEMA, query
from leasebox.errors import ConfigurationError, DatabaseError
from leasebox.messages import DEFAULT_RECEIPT_TTL_SECONDS

EVENT_BATCH = 10_000


@dataclass(frozen=True)
class PruneResult:
    """What one `prune` removed: sent messages and receipts, and the partitions dropped;
    `kept` counts the messages of those days moved forward because they are still wanted."""

    sent: int
    receipts: int
    partitions: tuple[str, ...] = ()
    kept: int = 0
    events: int = 0


def prune(
    conn: psycopg.Connection[Any],
    *,
    retention_seconds: float,
    schema: str = DEFAULT_SCHEMA,
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS,
    allow_short_retention: bool = False,
) -> PruneResult:
    """Drop the days of messages, history and receipts older than the retention.

    `receipt_ttl_seconds` is the longest receipt TTL the producers use; a shorter retention
    is a `ConfigurationError` unless `allow_short_retention`. Commits as it goes (a
    transaction the caller left open is committed first).
    """
    if retention_seconds < 0:
        raise ConfigurationError("the retention must not be negative")
    if retention_seconds < receipt_ttl_seconds and not allow_short_retention:
        raise ConfigurationError(
            f"a retention of {_duration(retention_seconds)} is shorter than the receipt TTL "
            f"({_duration(receipt_ttl_seconds)}): a request retried after its row was pruned "
            "would be sent again; give the producers' TTL (--receipt-ttl) or allow it "
            "(--allow-short-retention)"
        )
    if not conn.autocommit:
        conn.commit()
    try:
        return _prune(conn, retention_seconds, schema)
    except psycopg.errors.LockNotAvailable:
        raise DatabaseError(
            f"another transaction is using the days to drop (it held a lock for over "
            f"{LOCK_TIMEOUT}): nothing was dropped; run prune again when it is done"
        ) from None


def _prune(conn: psycopg.Connection[Any], retention_seconds: float, schema: str) -> PruneResult:
    ensure_partitions(conn, schema)
    today, cutoff = _days(conn, retention_seconds)
    # Counted before the tables are locked, so that the lock (which every statement on them
    # waits for) covers the moves and the drops alone: counting a day of a million messages
    # takes a few hundred milliseconds. No message or receipt is written to a past day
    # meanwhile; the messages moved out are counted as they move (a dead letter purged in
    # between is the one row counted that the drop does not remove). The count holds the
    # maintenance lock, which only other maintenance waits for: a day another prune drops
    # while it is read would fail the read.
    with conn.transaction():
        serialise_maintenance(conn, schema)
        counted = {
            table: _rows(
                conn,
                [p for p in list_partitions(conn, table, schema) if _before(p, cutoff)],
                schema,
            )
            for table in ("outbox", "receipts")
        }
    with conn.transaction():
        serialise_maintenance(conn, schema)
        old = {
            table: [p for p in list_partitions(conn, table, schema) if _before(p, cutoff)]
            for table in PARTITIONED_TABLES
        }
        dropped = [p for partitions in old.values() for p in partitions]
        bound_lock_waits(conn)  # after the maintenance lock: another prune may take long
        _hold(conn, dropped, schema)
        kept = _keep_wanted(conn, schema, today, cutoff, short=cutoff >= today)
        drop_partitions(conn, dropped, schema)
    # Another prune may have dropped some of them meanwhile: only what this one drops counts.
    sent = sum(counted["outbox"].get(p.name, 0) for p in old["outbox"]) - kept
    receipts = sum(counted["receipts"].get(p.name, 0) for p in old["receipts"])
    events = _forget_events(conn, schema, cutoff)
    return PruneResult(sent, receipts, tuple(sorted(p.name for p in dropped)), kept, events)


def _forget_events(conn: psycopg.Connection[Any], schema: str, cutoff: date) -> int:
    """Delete the provider events received before `cutoff`, a batch per transaction (they
    are not partitioned: a day of them is a small share of a day of messages), and the
    hourly counts older than it and than the week the reputation rates read."""
    deleted = 0
    while True:
        with conn.transaction():
            row = conn.execute(
                query("prune_events", schema), {"before": cutoff, "limit": EVENT_BATCH}
            ).fetchone()
        batch = int(row[0]) if row else 0
        deleted += batch
        if batch < EVENT_BATCH:
            return deleted


def _days(conn: psycopg.Connection[Any], retention_seconds: float) -> tuple[date, date]:
    """Today, and the first day retention keeps (the UTC day of now - retention)."""
    row = conn.execute(
        "SELECT (now() AT TIME ZONE 'UTC')::date,"
        " ((now() - make_interval(secs => %s)) AT TIME ZONE 'UTC')::date",
        (retention_seconds,),
    ).fetchone()
    if not conn.autocommit:
        conn.commit()
    if row is None:
        raise DatabaseError("the database returned no row for today's date and the cutoff")
    today: date = row[0]
    cutoff: date = row[1]
    return today, cutoff


def _before(partition: Partition, cutoff: date) -> bool:
    """Whether every day of `partition` is before `cutoff` (the default one never is)."""
    return not partition.default and partition.end is not None and partition.end <= cutoff


def _hold(conn: psycopg.Connection[Any], partitions: list[Partition], schema: str) -> None:
    """Lock the partitioned tables, with all their partitions, in one statement before
    anything else, when there are partitions to drop: nothing reads or writes them until
    the moves and the drops are done.

    Dropping a partition takes its table's lock: asked for after the partition's own, it
    would close a cycle with a reader that holds the table and waits for the partition (a
    deadlock whose victim may be a producer's `enqueue`). Asked for first, it waits for the
    readers holding the tables and holds nothing they wait for. All three go together, as
    the moves write to each of them.
    """
    if partitions:
        names = sql.SQL(", ").join(sql.Identifier(schema, table) for table in PARTITIONED_TABLES)
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(names))


def _keep_wanted(
    conn: psycopg.Connection[Any], schema: str, today: date, cutoff: date, *, short: bool
) -> int:
    """Move the still wanted messages of the days before `cutoff` to today; how many.

    With a retention under a day (`short`), any live receipt may name such a message, not
    only a late one, so every live receipt is read.
    """
    name = "kept_messages_short_retention" if short else "kept_messages"
    ids = [int(row[0]) for row in conn.execute(query(name, schema), {"before": cutoff})]
    if not ids:
        return 0
    params = {"ids": ids, "day": today, "before": cutoff}
    row = conn.execute(query("keep_messages", schema), params).fetchone()
    return int(row[0]) if row else 0


def _rows(
    conn: psycopg.Connection[Any], partitions: list[Partition], schema: str
) -> dict[str, int]:
    """How many rows each of `partitions` holds, by name."""
    counts = {}
    for partition in partitions:
        statement = sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(schema, partition.name)
        )
        row = conn.execute(statement).fetchone()
        counts[partition.name] = int(row[0]) if row else 0
    return counts


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
