"""Dead letters listed, requeued and purged; old history pruned in batches."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import psycopg
import pytest

from leasebox.cli.common import parse_duration
from leasebox.cli.main import main
from leasebox.db.partitions import ensure_partitions
from leasebox.errors import ConfigurationError, DatabaseError
from leasebox.store.dead_letters import (
    DeadLetterFilter,
    count_dead_letters,
    list_dead_letters,
    purge_dead_letters,
    requeue_dead_letters,
)
from leasebox.store.pruning import prune
from support.outbox_rows import insert_receipt
from support.worker_doubles import Insert, row_of, statuses


def _dead(
    db_insert: Insert, db_now: datetime, reason: str, age_hours: float = 0, **fields: object
) -> int:
    return db_insert(
        status="dead",
        dead_reason=reason,
        attempts=1,
        last_error="550 no such user",
        last_error_class="smtp_550",
        updated_at=db_now - timedelta(hours=age_hours),
        **fields,
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("7d", 604800),
        ("2w", 1209600),
        ("1.5h", 5400),
    ],
)
def test_durations_read_with_their_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1y", "-1h", "1 hour"])
def test_a_bad_duration_is_a_configuration_error(text: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid duration"):
        parse_duration(text)


def test_dead_letters_filter_by_kind_reason_age_and_id(
    db_conn: psycopg.Connection, db_insert: Insert, db_now: datetime
) -> None:
    old_rejected = _dead(db_insert, db_now, "rejected", age_hours=3)
    new_rejected = _dead(db_insert, db_now, "rejected")
    expired_invite = _dead(db_insert, db_now, "expired", age_hours=5, kind="invite")
    db_insert()  # pending: never a dead letter

    def ids(**criteria: object) -> list[int]:
        selection = DeadLetterFilter(**criteria)  # type: ignore[arg-type]
        return [d.id for d in list_dead_letters(db_conn, selection)]

    assert ids() == [expired_invite, old_rejected, new_rejected]
    assert ids(kinds=("otp",)) == [old_rejected, new_rejected]
    assert ids(reason="expired") == [expired_invite]
    assert ids(older_than_seconds=3600) == [expired_invite, old_rejected]
    assert ids(ids=(new_rejected, 999)) == [new_rejected]
    assert ids(limit=1) == [expired_invite]
    assert count_dead_letters(db_conn, DeadLetterFilter(reason="rejected")) == 2
    [letter] = list_dead_letters(db_conn, DeadLetterFilter(ids=(old_rejected,)))
    assert (letter.kind, letter.dead_reason, letter.last_error_class) == (
        "otp",
        "rejected",
        "smtp_550",
    )


def test_requeue_resets_attempts_and_makes_the_row_ready_now(
    db_conn: psycopg.Connection, db_insert: Insert, db_now: datetime
) -> None:
    chosen = _dead(db_insert, db_now, "rejected", available_at=db_now - timedelta(days=1))
    other = _dead(db_insert, db_now, "expired")
    assert requeue_dead_letters(db_conn, DeadLetterFilter(reason="rejected")) == [chosen]
    row = row_of(db_conn, chosen)
    assert (row["status"], row["attempts"], row["dead_reason"]) == ("pending", 0, None)
    assert row["available_at"] >= db_now
    assert row_of(db_conn, other)["status"] == "dead"


def test_requeue_keeps_an_otp_expiry_unless_told_to_clear_it(
    db_conn: psycopg.Connection, db_insert: Insert, db_now: datetime
) -> None:
    kept = _dead(db_insert, db_now, "expired", expires_at=db_now - timedelta(minutes=1))
    cleared = _dead(db_insert, db_now, "expired", expires_at=db_now - timedelta(minutes=1))
    requeue_dead_letters(db_conn, DeadLetterFilter(ids=(kept,)))
    requeue_dead_letters(db_conn, DeadLetterFilter(ids=(cleared,)), clear_expiry=True)
    assert row_of(db_conn, kept)["expires_at"] is not None
    assert row_of(db_conn, cleared)["expires_at"] is None


def test_purge_deletes_in_batches_up_to_its_limit(
    db_conn: psycopg.Connection, db_insert: Insert, db_now: datetime
) -> None:
    for _ in range(7):
        _dead(db_insert, db_now, "rejected")
    assert purge_dead_letters(db_conn, DeadLetterFilter(limit=5), batch_size=2) == 5
    assert purge_dead_letters(db_conn, DeadLetterFilter(), batch_size=2) == 2
    assert statuses(db_conn) == {}


def test_prune_drops_old_days_and_keeps_what_is_still_wanted(
    db_conn: psycopg.Connection, db_insert: Insert, db_now: datetime
) -> None:
    days = timedelta(days=1)
    old = [db_insert(status="sent", sent_at=db_now - 8 * days) for _ in range(5)]
    recent = db_insert(status="sent", sent_at=db_now - days)
    dead = _dead(db_insert, db_now, "rejected", created_at=db_now - 30 * days)
    waiting = db_insert(created_at=db_now - 9 * days, available_at=db_now + days)
    named = db_insert(status="sent", sent_at=db_now - 9 * days)
    insert_receipt(db_conn, named, "late", expires_at=db_now + days)
    for key, expired_days_ago in (("a", 10), ("b", 1)):
        insert_receipt(db_conn, recent, key, expires_at=db_now - expired_days_ago * days)
    db_conn.commit()

    result = prune(db_conn, retention_seconds=7 * 86400)

    assert (result.sent, result.receipts, result.kept) == (5, 1, 3)
    assert result.partitions  # whole days, not rows
    remaining = {r[0]: r[1] for r in db_conn.execute("SELECT id, status FROM leasebox.messages")}
    assert remaining == {recent: "sent", dead: "dead", waiting: "pending", named: "sent"}
    assert not set(old) & set(remaining)
    keys = db_conn.execute("SELECT idempotency_key FROM leasebox.receipts ORDER BY 1").fetchall()
    assert keys == [("b",), ("late",)]
    again = prune(db_conn, retention_seconds=7 * 86400)
    assert (again.sent, again.receipts, again.kept, again.partitions) == (0, 0, 0, ())


def test_prune_gives_up_at_once_on_a_day_another_transaction_reads_and_drops_nothing(
    db_conn: psycopg.Connection, db_dsn: str, db_insert: Insert, db_now: datetime
) -> None:
    # A lock request that waits queues every later reader of that day behind it (an
    # explicit delivery key's lookup reads every day): prune must not wait on a long reader.
    old = [db_insert(status="sent", sent_at=db_now - timedelta(days=9)) for _ in range(3)]
    ensure_partitions(db_conn)  # their day gets its partition, as it would have had
    db_conn.execute("SET statement_timeout = '10s'")  # a prune that waits fails, not hangs
    db_conn.commit()
    with psycopg.connect(db_dsn) as reader:
        reader.execute("SELECT count(*) FROM leasebox.messages")  # its transaction stays open
        with pytest.raises((DatabaseError, psycopg.Error)) as caught:
            prune(db_conn, retention_seconds=7 * 86400)
        assert isinstance(caught.value, DatabaseError), f"prune waited: {caught.value}"
        assert "another transaction is using the days to drop" in str(caught.value)
        assert "nothing was dropped" in str(caught.value)
        assert {r[0] for r in db_conn.execute("SELECT id FROM leasebox.messages")} >= set(old)
        db_conn.rollback()
    assert prune(db_conn, retention_seconds=7 * 86400).sent == 3


def test_the_dead_letter_commands_list_requeue_and_purge(
    db_dsn: str,
    db_conn: psycopg.Connection,
    db_insert: Insert,
    db_now: datetime,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = _dead(db_insert, db_now, "rejected", age_hours=2)
    second = _dead(db_insert, db_now, "expired", kind="invite")
    assert main(["dead-letters", "list", "--dsn", db_dsn, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [d["id"] for d in listed] == [first, second]
    assert "recipient" not in listed[0]

    assert main(["dead-letters", "list", "--dsn", db_dsn, "--older-than", "1h"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["ID", "KIND", "REASON"]
    assert len(table) == 2

    assert main(["dead-letters", "purge", "--dsn", db_dsn, "--kind", "invite"]) == 2
    assert "purge would delete 1 dead letters for good; pass --yes" in capsys.readouterr().err
    assert main(["dead-letters", "purge", "--dsn", db_dsn, "--kind", "invite", "--yes"]) == 0
    assert capsys.readouterr().out.strip() == "purged 1 dead letters"

    assert main(["dead-letters", "requeue", "--dsn", db_dsn, "--id", str(first), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"requeued": [first]}
    assert statuses(db_conn) == {"pending": 1}


def test_the_prune_command_reports_what_it_deleted(
    db_dsn: str, db_insert: Insert, db_now: datetime, capsys: pytest.CaptureFixture[str]
) -> None:
    db_insert(status="sent", sent_at=db_now - timedelta(days=3))
    assert main(["prune", "--dsn", db_dsn, "--retention", "1d", "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    assert (reported["sent"], reported["receipts"], reported["kept"]) == (1, 0, 0)
    assert [p.split("_")[0] for p in reported["partitions"]] == ["history", "outbox"]
    assert main(["prune", "--dsn", db_dsn, "--retention", "forever"]) == 2
    assert "invalid duration 'forever'" in capsys.readouterr().err
