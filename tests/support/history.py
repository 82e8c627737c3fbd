"""Reading the attempt history in tests: every row of a message's history, in order.

The product's own reader belongs to `leasebox trace`; the tests read the table directly so
that what they assert is what the statements wrote, column by column, with nothing in
between. Rows come back in the order they were written (the identity column), which is the
order of the events for one message.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row

# The product's row type, so that a column added to the table is added once.
from leasebox.store.history import HistoryEvent as Event

__all__ = [
    "Event",
    "add_history",
    "check_histories",
    "check_history",
    "count_rows",
    "events",
    "histories",
    "histories_at",
    "history_of",
]


def _select(schema: str, where: sql.Composable) -> sql.Composed:
    columns = sql.SQL(", ").join(sql.Identifier(f.name) for f in fields(Event))
    return sql.SQL("SELECT {} FROM {}.history WHERE {} ORDER BY outbox_id, id").format(
        columns, sql.Identifier(schema), where
    )


def history_of(
    conn: psycopg.Connection[Any], outbox_id: int, *, schema: str = "leasebox"
) -> list[Event]:
    """Every history row of one message, oldest first."""
    statement = _select(schema, sql.SQL("outbox_id = %(id)s"))
    with conn.cursor(row_factory=class_row(Event)) as cur:
        rows = cur.execute(statement, {"id": outbox_id}).fetchall()
    conn.rollback()  # leave no transaction open between the test's steps
    return rows


def histories(
    conn: psycopg.Connection[Any],
    outbox_ids: Iterable[int] | None = None,
    *,
    schema: str = "leasebox",
) -> dict[int, list[Event]]:
    """The history of these messages (of every message when None), by outbox id."""
    if outbox_ids is None:
        where: sql.Composable = sql.SQL("true")
        params: dict[str, Any] = {}
    else:
        where = sql.SQL("outbox_id = ANY(%(ids)s)")
        params = {"ids": list(outbox_ids)}
    found: dict[int, list[Event]] = {}
    with conn.cursor(row_factory=class_row(Event)) as cur:
        for row in cur.execute(_select(schema, where), params).fetchall():
            found.setdefault(row.outbox_id, []).append(row)
    conn.rollback()
    return found


def histories_at(dsn: str, outbox_ids: Iterable[int] | None = None) -> dict[int, list[Event]]:
    """`histories` over a fresh connection to `dsn` (for tests that run worker processes)."""
    with psycopg.connect(dsn) as conn:
        return histories(conn, outbox_ids)


def events(rows: Iterable[Event]) -> list[str]:
    """The event names of some history rows, in order."""
    return [row.event for row in rows]


def count_rows(conn: psycopg.Connection[Any], *, schema: str = "leasebox") -> int:
    """How many history rows there are, for every message."""
    statement = sql.SQL("SELECT count(*) FROM {}.history").format(sql.Identifier(schema))
    row = conn.execute(statement).fetchone()
    conn.rollback()
    assert row is not None
    return int(row[0])


# What ends a lease, and the status each leaves the row in (lease_expired: pending or dead).
_ENDS_A_LEASE = {"sent", "retry", "ambiguous", "dead", "released", "lease_expired"}


def check_history(rows: Iterable[Event], row: dict[str, Any]) -> None:
    """Assert that a message's history is a walk of the state diagram ending where its row is.

    Each claim starts a lease on a row that held none, counting one attempt; exactly one event
    ends each lease, naming its token (released gives its attempt back); a `lease_lost`
    names a lease already over; `expired` and `requeued` happen outside any lease. The last
    event that is not a late `lease_lost` says the row's status, reason and provider id.
    """
    where = f"message {row['id']}"
    current: uuid.UUID | None = None
    claims: dict[uuid.UUID, int] = {}  # every lease's token: the attempt it counted
    attempts = 0
    final: Event | None = None
    for event in rows:
        name, token = event.event, event.lease_token
        if name == "claimed":
            assert current is None, f"{where}: claimed while a lease was held: {event}"
            assert token is not None, f"{where}: a claim without a token"
            attempts += 1
            assert event.attempt == attempts, f"{where}: claim {event.attempt}, not {attempts}"
            current, claims[token] = token, attempts
        elif name in _ENDS_A_LEASE:
            assert current is not None, f"{where}: {event} while no lease was held"
            assert token == current, f"{where}: {event} ends another lease"
            assert event.attempt == attempts, f"{where}: {event} is not attempt {attempts}"
            if name == "released":
                attempts -= 1
            current = None
        elif name == "lease_lost":
            assert token in claims, f"{where}: a lost lease that was never claimed: {event}"
            assert token != current, f"{where}: the lease held was lost: {event}"
            assert event.attempt == claims[token], f"{where}: {event}"
            continue
        else:
            assert current is None, f"{where}: {name} while a lease was held"
            if name == "requeued":
                attempts = 0
        final = event
    assert attempts == row["attempts"], f"{where}: {attempts} attempts counted, {row['attempts']}"
    status = row["status"]
    if status in ("pending", "processing"):
        assert (current is not None) == (status == "processing"), where
        return
    assert final is not None, f"{where}: {status} without history"
    if status == "sent":
        assert (final.event, final.provider_message_id) == ("sent", row["provider_message_id"])
        assert final.worker_id == row["leased_by"], where
    else:
        assert final.event in ("dead", "lease_expired", "expired"), f"{where}: {final}"
        assert final.dead_reason == row["dead_reason"], f"{where}: {final}"


def check_histories(conn: psycopg.Connection[Any], *, schema: str = "leasebox") -> int:
    """`check_history` for every message of the outbox; returns how many were checked."""
    statement = sql.SQL(
        "SELECT id, status, attempts, leased_by, provider_message_id, dead_reason FROM {}.messages"
    ).format(sql.Identifier(schema))
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(statement).fetchall()
    conn.rollback()
    written = histories(conn, schema=schema)
    for row in found:
        check_history(written.get(row["id"], []), row)
    return len(found)


def add_history(
    conn: psycopg.Connection[Any], outbox_id: int, *names: str, schema: str = "leasebox"
) -> int:
    """Give a message some history rows, in its day partition as the statements write them
    (events only, at now); commits and returns the message's id."""
    statement = sql.SQL(
        "INSERT INTO {schema}.history (outbox_id, bucket, kind, event, at)"
        " SELECT id, bucket, kind, %(event)s, now() FROM {schema}.outbox WHERE id = %(id)s"
    ).format(schema=sql.Identifier(schema))
    for name in names:
        assert conn.execute(statement, {"id": outbox_id, "event": name}).rowcount == 1
    conn.commit()
    return outbox_id
