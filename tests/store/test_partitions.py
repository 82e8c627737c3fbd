"""Day partitions: ready before their day, rows of a day without one never lost or refused,
maintenance safe to repeat and to race, and retention that drops days, not rows."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox import enqueue
from leasebox.db.migrations import migrate
from leasebox.db.partitions import (
    DAYS_AHEAD,
    KEPT_DAY,
    PARTITIONED_TABLES,
    Partition,
    database_today,
    day_partition_name,
    default_partition_rows,
    ensure_partitions,
    list_partitions,
)
from leasebox.store.pruning import prune
from support.history import add_history, histories
from support.outbox_rows import SEALING, insert_message, insert_receipt, otp


def sent_message(conn: psycopg.Connection[Any], key: str, at: datetime) -> int:
    """A message sent (and created) at `at`, written by hand."""
    return insert_message(
        conn,
        status="sent",
        sent_at=at,
        kind="otp",
        recipient="ada@example.com",
        template="otp",
        delivery_key=key,
    )


def day_partitions(conn: psycopg.Connection[Any], table: str) -> list[date]:
    found = [p.start for p in list_partitions(conn, table) if not p.default and p.end]
    conn.rollback()
    return sorted(day for day in found if day is not None)


def test_a_migrated_schema_has_every_table_partitioned_from_today_to_a_week_ahead(
    db_conn: psycopg.Connection[Any], db_dsn: str
) -> None:
    migrate(db_dsn)  # as every start does: nothing to apply, the days made ready
    today = database_today(db_conn)
    for table in PARTITIONED_TABLES:
        days = day_partitions(db_conn, table)
        assert days[-DAYS_AHEAD - 1 :] == [today + timedelta(days=n) for n in range(8)], table
        assert day_partition_name(table, today) in {p.name for p in list_partitions(db_conn, table)}
        assert default_partition_rows(db_conn, table) == 0


def test_a_day_without_a_partition_takes_its_rows_and_maintenance_gives_them_their_own(
    db_conn: psycopg.Connection[Any],
) -> None:
    ensure_partitions(db_conn)  # the session's schema may have been made the day before
    later = datetime.now(UTC) + timedelta(days=40)
    outbox_id = sent_message(db_conn, "far", later)
    insert_receipt(db_conn, outbox_id, "k", expires_at=later + timedelta(days=1))
    db_conn.commit()
    assert [default_partition_rows(db_conn, t) for t in PARTITIONED_TABLES] == [1, 1, 1]

    created = ensure_partitions(db_conn)

    # The receipt's day, and (its TTL is followed) every receipts day up to a week past it.
    receipt_day = later.date() + timedelta(days=1)
    today = database_today(db_conn)
    receipt_days = {today + timedelta(days=n) for n in range((receipt_day - today).days + 8)}
    assert {(p.table, p.start) for p in created} == {
        ("outbox", later.date()),
        ("history", later.date()),
        *(("receipts", day) for day in receipt_days if day > today + timedelta(days=DAYS_AHEAD)),
    }
    assert [default_partition_rows(db_conn, t) for t in PARTITIONED_TABLES] == [0, 0, 0]
    row = db_conn.execute(
        "SELECT status, delivery_key FROM leasebox.messages WHERE id = %s", (outbox_id,)
    ).fetchone()
    assert row == ("sent", "far")
    found = db_conn.execute(
        "SELECT tableoid::regclass::text FROM leasebox.outbox WHERE id = %s", (outbox_id,)
    ).fetchone()
    assert found == (f"leasebox.{day_partition_name('outbox', later.date())}",)


def test_maintaining_again_creates_nothing_and_racing_maintainers_create_each_day_once(
    db_conn: psycopg.Connection[Any], db_dsn: str
) -> None:
    ensure_partitions(db_conn)  # the session's schema may have been made the day before
    today = database_today(db_conn)
    assert ensure_partitions(db_conn) == []
    errors: list[BaseException] = []
    made: list[Partition] = []
    barrier = threading.Barrier(4)

    def maintain() -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                barrier.wait()
                made.extend(ensure_partitions(conn, today=today + timedelta(days=30)))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=maintain) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted((p.table, p.start) for p in made) == sorted(
        (table, today + timedelta(days=30 + n))
        for table in PARTITIONED_TABLES
        for n in range(DAYS_AHEAD + 1)
    )


@pytest.mark.parametrize(
    ("bound", "expected"),
    [
        (
            "FOR VALUES FROM ('2026-12-02') TO ('2026-12-03')",
            (date(2026, 12, 2), date(2026, 12, 3)),
        ),
        ("FOR VALUES FROM (MINVALUE) TO ('2026-12-03')", (None, date(2026, 12, 3))),
        ("DEFAULT", (None, None)),
    ],
)
def test_partition_bounds_are_read_as_days(
    bound: str, expected: tuple[date | None, date | None]
) -> None:
    from leasebox.db.partitions import _partition

    found = _partition("outbox", "p", bound)
    assert (found.start, found.end) == expected
    assert found.default == (bound == "DEFAULT")


def test_a_partition_by_another_scheme_is_named_in_a_clear_error() -> None:
    from leasebox.db.partitions import _partition

    with pytest.raises(ValueError, match="partition odd of outbox has bounds leasebox cannot"):
        _partition("outbox", "odd", "FOR VALUES IN ('x')")


def test_a_retention_under_a_day_keeps_every_message_a_live_receipt_names(
    db_conn: psycopg.Connection[Any],
) -> None:
    yesterday = datetime.now(UTC) - timedelta(days=1)
    named, forgotten = (sent_message(db_conn, key, yesterday) for key in ("named", "forgotten"))
    # An ordinary receipt: made the day its message was, live until later today.
    insert_receipt(db_conn, named, "k", expires_at=datetime.now(UTC) + timedelta(minutes=5))
    db_conn.commit()

    result = prune(db_conn, retention_seconds=0, allow_short_retention=True)

    assert (result.sent, result.kept) == (1, 1)
    remaining = db_conn.execute("SELECT id FROM leasebox.outbox").fetchall()
    assert remaining == [(named,)]
    assert forgotten != named


def test_a_kept_message_takes_its_history_and_stays_findable_by_its_receipt(
    db_conn: psycopg.Connection[Any],
) -> None:
    old = datetime.now(UTC) - timedelta(days=20)
    outbox_id = add_history(
        db_conn,
        insert_message(
            db_conn,
            created_at=old,
            kind="otp",
            recipient="ada@example.com",
            template="otp",
            delivery_key="otp:k1",
            status="dead",
            dead_reason="rejected",
            attempts=1,
        ),
        "claimed",
        "dead",
    )
    prune(db_conn, retention_seconds=7 * 86400)
    again = enqueue(db_conn, otp(delivery_key="otp:k1"), idempotency_key="r1", cipher=SEALING)
    db_conn.commit()

    assert (again.outbox_id, again.reused) == (outbox_id, True)
    assert [e.event for e in histories(db_conn)[outbox_id]] == ["claimed", "dead"]
    row = db_conn.execute(
        "SELECT m.status, m.bucket, q.bucket FROM leasebox.messages AS m"
        " JOIN leasebox.queue AS q USING (id) WHERE m.id = %s",
        (outbox_id,),
    ).fetchone()
    assert row == ("dead", KEPT_DAY, KEPT_DAY)  # in the kept partition, which is never dropped


def test_the_legacy_partition_goes_whole_once_its_last_day_is_past_the_retention(
    db_conn: psycopg.Connection[Any],
) -> None:
    # What migration 0004 makes of an outbox written before it: one partition of its days.
    db_conn.execute(
        "CREATE TABLE leasebox.outbox_legacy PARTITION OF leasebox.outbox"
        " FOR VALUES FROM (MINVALUE) TO ((now() AT TIME ZONE 'UTC')::date - 10)"
    )
    old = sent_message(db_conn, "old", datetime.now(UTC) - timedelta(days=30))
    db_conn.commit()

    result = prune(db_conn, retention_seconds=7 * 86400)

    assert "outbox_legacy" in result.partitions
    assert result.sent == 1
    assert "outbox_legacy" not in {p.name for p in list_partitions(db_conn, "outbox")}
    assert db_conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone() == (0,)
    assert old > 0
