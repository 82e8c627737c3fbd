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
They move first, with their history, to the kept partition (`KEPT_DAY`), which retention
never drops: in batches of their own that take row locks only, so that producers and workers
go on writing however many there are, and once, so that the next retention leaves them
where they are. Then the drop locks the tables (in the producers' order, in short tries) and
moves, under the lock, only what became wanted meanwhile (a request that named an old
message by its delivery key). A kept message leaves once nothing wants it any more and
nothing happened to it for a retention. Rows of days that never had a partition wait in a
default partition: the partition maintenance that runs first gives each such day its
partition, so they go too.

The provider events received before the same day go too, deleted in batches (with the hourly
counts, which the reputation rates read for a week).

A retention shorter than the producers' receipt TTL is refused unless the caller says it
knows: a request retried after its message was dropped is a new request, and sends again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import Any

import psycopg
from psycopg import sql

from leasebox.db.partitions import (
    KEPT_DAY,
    PARTITIONED_TABLES,
    LocksUnavailable,
    Partition,
    PartitionsIncomplete,
    drop_partitions,
    ensure_partitions,
    list_partitions,
    lock_briefly,
    serialise_maintenance,
)
from leasebox.db.queries import DEFAULT_SCHEMA, query
from leasebox.errors import ConfigurationError, DatabaseError
from leasebox.messages import DEFAULT_RECEIPT_TTL_SECONDS

EVENT_BATCH = 10_000


@dataclass(frozen=True)
class PruneResult:
    """What one `prune` removed: sent messages and receipts, and the partitions dropped;
    `kept` counts the messages of those days moved to the kept partition, still wanted.
    `problem` is what the partition upkeep that runs first could not do (None: all of it);
    `events` counts the provider events deleted."""

    sent: int
    receipts: int
    partitions: tuple[str, ...] = ()
    kept: int = 0
    problem: str | None = None
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
    problem = None
    try:
        ensure_partitions(conn, schema)
    except PartitionsIncomplete as exc:  # the days to drop do not depend on the days ahead
        problem = str(exc)
    try:
        result = _prune(conn, retention_seconds, schema)
    except LocksUnavailable as exc:
        raise DatabaseError(
            f"{exc}: nothing was dropped; run prune again when it is done"
            + (f"; also {problem}" if problem else "")
        ) from None
    return replace(result, problem=problem)


def _prune(conn: psycopg.Connection[Any], retention_seconds: float, schema: str) -> PruneResult:
    today, cutoff, since = _days(conn, retention_seconds)
    short = cutoff >= today
    # Counted before the tables are locked, so that the lock (which every statement on them
    # waits for) covers the drops alone: counting a day of a million messages takes a few
    # hundred milliseconds. No message or receipt is written to a past day meanwhile; the
    # messages moved out are counted as they move (a dead letter purged in between is the
    # one row counted that the drop does not remove). The count holds the maintenance lock,
    # which only other maintenance waits for: a day another prune drops while it is read
    # would fail the read.
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
    # The messages of those days that are still wanted move to the kept partition first, in
    # batches that take row locks only: writers go on meanwhile, however many there are.
    kept = _keep_wanted(conn, schema, cutoff, short=short)
    with conn.transaction():
        serialise_maintenance(conn, schema)
        old = {
            table: [p for p in list_partitions(conn, table, schema) if _before(p, cutoff)]
            for table in PARTITIONED_TABLES
        }
        dropped = [p for partitions in old.values() for p in partitions]
        _hold(conn, dropped, schema)
        if dropped:
            # Under the lock, only what became wanted since (a receipt that names an old
            # message) or was held by a worker a moment ago is left to move: a few rows.
            kept += _keep_stragglers(conn, schema, cutoff, short=short)
            drop_partitions(conn, dropped, schema)
    forgotten = _forget(conn, schema, since)
    # Another prune may have dropped some of them meanwhile: only what this one drops counts.
    sent = sum(counted["outbox"].get(p.name, 0) for p in old["outbox"]) - kept + forgotten
    receipts = sum(counted["receipts"].get(p.name, 0) for p in old["receipts"])
    events = _forget_events(conn, schema, cutoff)
    return PruneResult(
        max(sent, 0), receipts, tuple(sorted(p.name for p in dropped)), kept, events=events
    )


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


def _days(conn: psycopg.Connection[Any], retention_seconds: float) -> tuple[date, date, datetime]:
    """Today, the first day retention keeps (the UTC day of now - retention), and that
    moment (now - retention)."""
    row = conn.execute(
        "SELECT (now() AT TIME ZONE 'UTC')::date,"
        " ((now() - make_interval(secs => %(s)s)) AT TIME ZONE 'UTC')::date,"
        " now() - make_interval(secs => %(s)s)",
        {"s": retention_seconds},
    ).fetchone()
    if not conn.autocommit:
        conn.commit()
    if row is None:
        raise DatabaseError("the database returned no row for today's date and the cutoff")
    today: date = row[0]
    cutoff: date = row[1]
    since: datetime = row[2]
    return today, cutoff, since


def _before(partition: Partition, cutoff: date) -> bool:
    """Whether every day of `partition` is before `cutoff` (the default one never is)."""
    return not partition.default and partition.end is not None and partition.end <= cutoff


# The order in which retention locks the partitioned tables: the producers' order. A request
# with an idempotency key reads its receipt before the outbox, and no producer reads the
# history; the workers' statements, which touch the history before the outbox, wait on a
# try that holds them for less than a deadlock check takes (`lock_briefly`).
LOCK_ORDER = ("receipts", "outbox", "history")
# Kept messages moved, or forgotten, per transaction.
KEEP_BATCH = 1000


def _hold(conn: psycopg.Connection[Any], partitions: list[Partition], schema: str) -> None:
    """Lock the partitioned tables, with all their partitions, before anything else, when
    there are partitions to drop: nothing reads or writes them until the drops are done.

    Dropping a partition takes its table's lock: asked for after the partition's own, it
    would close a cycle with a reader that holds the table and waits for the partition.
    Asked for first, in the producers' order (`LOCK_ORDER`) and in short tries, it waits for
    the transactions holding the tables and never holds one while a producer waiting on it
    could be chosen as a deadlock's victim: a try gives everything back first.
    """
    if partitions:
        names = sql.SQL(", ").join(sql.Identifier(schema, table) for table in LOCK_ORDER)
        statement = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(names)
        lock_briefly(conn, [statement], what="the days to drop")


def _wanted(conn: psycopg.Connection[Any], schema: str, cutoff: date, short: bool) -> list[int]:
    """The still wanted messages of the days before `cutoff`. With a retention under a day
    (`short`), any live receipt may name such a message, not only a late one, so every live
    receipt is read."""
    name = "kept_messages_short_retention" if short else "kept_messages"
    return [int(row[0]) for row in conn.execute(query(name, schema), {"before": cutoff})]


def _move_to_kept(
    conn: psycopg.Connection[Any], schema: str, ids: list[int], cutoff: date
) -> tuple[int, int]:
    """Move `ids` to the kept partition; how many moved, and how many were left behind (their
    queue row held by another transaction)."""
    params = {"ids": ids, "day": KEPT_DAY, "before": cutoff}
    row = conn.execute(query("keep_messages", schema), params).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _keep_wanted(conn: psycopg.Connection[Any], schema: str, cutoff: date, *, short: bool) -> int:
    """Move the still wanted messages of the days before `cutoff` to the kept partition, a
    batch a transaction, before the tables are locked; how many moved.

    Each batch takes row locks only (skipping a queue row a worker holds), so producers and
    workers go on writing meanwhile; and a message is moved once: the kept partition is
    never dropped, so the next retention finds it there and leaves it.
    """
    with conn.transaction():
        serialise_maintenance(conn, schema)
        ids = _wanted(conn, schema, cutoff, short)
    moved = 0
    for start in range(0, len(ids), KEEP_BATCH):
        with conn.transaction():
            serialise_maintenance(conn, schema)
            moved += _move_to_kept(conn, schema, ids[start : start + KEEP_BATCH], cutoff)[0]
    return moved


def _keep_stragglers(
    conn: psycopg.Connection[Any], schema: str, cutoff: date, *, short: bool
) -> int:
    """Under the tables' lock: move what is still wanted of the days about to be dropped; how
    many. A message that cannot be moved (its queue row held) keeps its day: nothing drops."""
    ids = _wanted(conn, schema, cutoff, short)
    if not ids:
        return 0
    moved, left = _move_to_kept(conn, schema, ids, cutoff)
    if left:
        raise LocksUnavailable(f"another transaction is using {left} message(s) of the days")
    return moved


def _forget(conn: psycopg.Connection[Any], schema: str, since: datetime) -> int:
    """Remove, a batch a transaction, the kept messages that nothing wants any more and that
    nothing happened to since `since`, and the abuse guard's subjects no send touched since;
    how many messages."""
    forgotten = 0
    params = {"kept": KEPT_DAY, "since": since, "limit": KEEP_BATCH}
    while True:
        with conn.transaction():
            row = conn.execute(query("forget_kept_messages", schema), params).fetchone()
        done = int(row[0]) if row else 0
        forgotten += done
        if done < KEEP_BATCH:
            break
    while True:
        with conn.transaction():
            done = conn.execute(query("forget_guard_subjects", schema), params).rowcount
        if done < KEEP_BATCH:
            return forgotten


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
