"""Partition upkeep and retention while producers keep writing, on real connections.

The parties run against each other: a producer's transaction that is open (or commits) while
a partition is attached or a day is dropped, a producer that retries a request while prune
holds the tables. Each step of the upkeep fails alone (a lock another transaction holds too
long) without stopping the others, and `leasebox prune` says so in one line.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sized
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from leasebox import enqueue
from leasebox.cli.main import main
from leasebox.db import partitions
from leasebox.db.partitions import (
    DAYS_AHEAD,
    PartitionsIncomplete,
    database_today,
    day_partition_name,
    default_partition_rows,
    ensure_partitions,
    list_partitions,
)
from leasebox.errors import DatabaseError
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from leasebox.store import pruning
from leasebox.store.pruning import PruneResult, prune
from support.outbox_rows import insert_message, otp
from support.waiting import wait_for, waiting_on_a_lock


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


@pytest.fixture
def patient_upkeep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The upkeep's lock tries go on for 30 s instead of 2.

    The tests that use it judge that the upkeep and busy producers never deadlock and that
    the upkeep gets its locks in the end. On a loaded machine a producer's transaction can
    hold a table for longer than the shipped 2 s between two tries; that is a slow machine,
    not a fault, and the tests that judge the give-up keep the shipped limit.
    """
    patient = functools.partial(partitions.lock_briefly, within=30.0)
    # Both modules call it by their own name for it.
    monkeypatch.setattr(partitions, "lock_briefly", patient)
    monkeypatch.setattr(pruning, "lock_briefly", patient)


MONTH = 30 * 86400.0
WEEK = 7 * 86400.0


def long_lived_receipt(conn: psycopg.Connection[Any], key: str, ttl: float = MONTH) -> None:
    """A request whose receipt lives a month: it expires on a day further out than the days
    made ahead, so it lands in the receipts' default partition until that day has its own."""
    enqueue(conn, otp(), idempotency_key=key, receipt_ttl_seconds=ttl)


def more_written(written: Sized, at_least: int) -> Callable[[], bool]:
    return lambda: len(written) >= at_least


def receipt_days(conn: psycopg.Connection[Any]) -> list[date]:
    days = [p.start for p in list_partitions(conn, "receipts") if not p.default and p.start]
    conn.rollback()
    return sorted(days)


@pytest.fixture
def maintenance(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """The connection the upkeep runs on, named so that a test sees it wait."""
    with psycopg.connect(db_dsn, autocommit=True, application_name="upkeep") as conn:
        yield conn


@pytest.mark.usefixtures("patient_upkeep")
def test_a_day_is_attached_while_a_producer_writes_to_the_default_partition(
    db_dsn: str, db_conn: psycopg.Connection[Any], maintenance: psycopg.Connection[Any]
) -> None:
    # Receipts expiring the day after the last one made: the first day the upkeep attaches.
    ttl = (DAYS_AHEAD + 1) * 86400.0
    long_lived_receipt(db_conn, "first", ttl)
    db_conn.commit()
    assert default_partition_rows(db_conn, "receipts") == 1
    db_conn.commit()
    with psycopg.connect(db_dsn) as producer, ThreadPoolExecutor(1) as upkeep:
        # A request of the same day, not committed yet: its receipt is in the default partition.
        long_lived_receipt(producer, "second", ttl)
        made = upkeep.submit(ensure_partitions, maintenance)
        wait_for(lambda: waiting_on_a_lock(db_conn, "upkeep"), what="the upkeep to wait")
        producer.commit()
        created = made.result(timeout=60)
    expiry_day = database_today(db_conn) + timedelta(days=DAYS_AHEAD + 1)
    assert ("receipts", expiry_day) in {(p.table, p.start) for p in created}
    assert default_partition_rows(db_conn, "receipts") == 0
    rows = db_conn.execute(
        "SELECT idempotency_key, tableoid::regclass::text FROM leasebox.receipts ORDER BY 1"
    ).fetchall()
    partition = f"leasebox.{day_partition_name('receipts', expiry_day)}"
    assert rows == [("first", partition), ("second", partition)]


def test_partitions_are_made_ahead_of_the_longest_receipt_ttl_in_use(
    db_conn: psycopg.Connection[Any],
) -> None:
    today = database_today(db_conn)
    long_lived_receipt(db_conn, "seen")
    db_conn.commit()
    ensure_partitions(db_conn)
    # The month-long TTL in use is seen: the days after its expiry day are made too, so the
    # receipts of the coming days (and of a slightly longer TTL) never wait in the default.
    assert receipt_days(db_conn)[-1] == today + timedelta(days=30 + DAYS_AHEAD)
    for n, key in enumerate(("next-day", "longer")):
        enqueue(
            db_conn,
            otp(),
            idempotency_key=key,
            receipt_ttl_seconds=MONTH + (n + 1) * 86400,
        )
    db_conn.commit()
    assert default_partition_rows(db_conn, "receipts") == 0


def test_a_step_that_cannot_get_its_lock_fails_alone_and_the_others_are_done(
    db_dsn: str, db_conn: psycopg.Connection[Any], maintenance: psycopg.Connection[Any]
) -> None:
    today = database_today(db_conn)
    long_lived_receipt(db_conn, "waiting")
    db_conn.commit()
    far = today + timedelta(days=40)
    with psycopg.connect(db_dsn) as reader:
        # A report over the receipts whose transaction stays open for longer than the upkeep
        # waits for the receipts' default partition.
        reader.execute("SELECT count(*) FROM leasebox.receipts")
        with pytest.raises(PartitionsIncomplete) as caught:
            ensure_partitions(maintenance, today=far)
        reader.rollback()
    incomplete = caught.value
    assert [f.table for f in incomplete.failures] == ["receipts"]
    assert "receipts" in str(incomplete)
    assert "\n" not in str(incomplete)
    # The outbox and history days, and the receipts' days that needed no lock of the default
    # partition's rows, were made all the same.
    made = {(p.table, p.start) for p in incomplete.created}
    for table in ("outbox", "history"):
        assert (table, far + timedelta(days=DAYS_AHEAD)) in made
    assert default_partition_rows(db_conn, "receipts") == 1


def test_prune_drops_the_old_days_when_a_partition_cannot_be_made_and_says_so_in_one_line(
    db_dsn: str, db_conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    today = database_today(db_conn)
    old_day = today - timedelta(days=20)
    ensure_partitions(db_conn, today=old_day)
    long_lived_receipt(db_conn, "waiting")
    # A table left behind under the name of a day the upkeep makes: that day cannot be made.
    blocker = day_partition_name("receipts", today + timedelta(days=33))
    db_conn.execute(sql.SQL("CREATE TABLE {} ()").format(sql.Identifier("leasebox", blocker)))
    db_conn.commit()

    code = main(["prune", "--dsn", db_dsn, "--retention", "7d"])

    out, err = capsys.readouterr()
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("leasebox prune: error: could not make every partition")
    assert f"receipts {today + timedelta(days=33)} (DuplicateTable" in lines[0]
    assert "Traceback" not in err
    assert "day partitions dropped" in out
    outbox_days = {p.start for p in list_partitions(db_conn, "outbox") if not p.default}
    receipts_days = {p.start for p in list_partitions(db_conn, "receipts") if not p.default}
    db_conn.rollback()
    assert old_day not in outbox_days
    # The days around the one that failed were made.
    assert {today + timedelta(days=n) for n in (30, 32, 34, 37)} <= receipts_days


@pytest.mark.usefixtures("patient_upkeep")
def test_days_are_attached_while_producers_keep_writing_to_the_default_partition(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    # Each round the producers switch to a TTL beyond every day made so far, so their
    # receipts land in the default partition while the upkeep attaches their day.
    ttl_days = [60]
    stop = threading.Event()
    errors: list[BaseException] = []
    written: list[int] = []

    def produce(n: int) -> None:
        try:
            with psycopg.connect(db_dsn) as conn:
                while not stop.is_set():
                    key = f"p{n}-{len(written)}"
                    ttl = ttl_days[-1] * 86400.0
                    enqueue(conn, otp(), idempotency_key=key, receipt_ttl_seconds=ttl)
                    conn.commit()
                    written.append(n)
        except BaseException as exc:  # asserted below
            errors.append(exc)

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(3)]
    for thread in producers:
        thread.start()
    try:
        with psycopg.connect(db_dsn, autocommit=True) as maintenance:
            for round_ in range(4):
                ttl_days.append(60 + 20 * round_)
                wait_for(more_written(written, len(written) + 10), what="the producers")
                ensure_partitions(maintenance)
    finally:
        stop.set()
        for thread in producers:
            thread.join()
    assert errors == []
    assert len(written) > 40


def sent_days_ago(conn: psycopg.Connection[Any], days: int, count: int) -> None:
    """`count` messages sent `days` days ago, in their day's partition."""
    for n in range(count):
        insert_message(
            conn,
            status="sent",
            sent_at=datetime.now(UTC) - timedelta(days=days),
            kind="otp",
            recipient="ada@example.com",
            template="otp",
            delivery_key=f"otp:old-{days}-{n}",
        )
    conn.commit()
    ensure_partitions(conn)


def prune_week(dsn: str) -> PruneResult:
    with psycopg.connect(dsn, autocommit=True, application_name="prune") as conn:
        return prune(conn, retention_seconds=WEEK)


@pytest.mark.usefixtures("patient_upkeep")
def test_prune_never_deadlocks_with_a_request_that_reuses_its_receipt(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    first = enqueue(db_conn, otp(), idempotency_key="retried", scope="login")
    db_conn.commit()
    sent_days_ago(db_conn, 9, 3)  # and every partition made: prune goes straight to the drop
    with psycopg.connect(db_dsn) as producer, ThreadPoolExecutor(1) as retention:
        # The retried request has read its receipt (as `enqueue` does first) and goes on to
        # the outbox while prune asks for the tables.
        producer.execute(
            "SELECT outbox_id FROM leasebox.receipts WHERE scope = 'login'"
            " AND idempotency_key = 'retried'"
        )
        pruned = retention.submit(prune_week, db_dsn)
        wait_for(lambda: waiting_on_a_lock(db_conn, "prune"), what="prune to wait")
        # Prune asks for the tables in the request's order (receipts first): it holds none
        # that the request needs, so the request never waits for it at all.
        producer.execute("SET LOCAL lock_timeout = '10ms'")
        again = enqueue(producer, otp(), idempotency_key="retried", scope="login")
        producer.commit()
        result = pruned.result(timeout=60)
    assert (again.outbox_id, again.reused) == (first.outbox_id, True)
    assert (result.sent, result.problem) == (3, None)


@pytest.mark.usefixtures("patient_upkeep")
def test_producers_retrying_requests_and_prunes_run_against_each_other_without_a_deadlock(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    keys = [f"request-{n}" for n in range(6)]
    for key in keys:
        enqueue(db_conn, otp(), idempotency_key=key, scope="login")
    db_conn.commit()
    stop = threading.Event()
    errors: list[BaseException] = []
    requests: list[str] = []

    def retry_requests(n: int) -> None:
        try:
            with psycopg.connect(db_dsn) as conn:
                while not stop.is_set():
                    key = keys[len(requests) % len(keys)]
                    conn.execute("INSERT INTO leasebox_app_log DEFAULT VALUES")
                    enqueue(conn, otp(), idempotency_key=key, scope="login")
                    enqueue(conn, otp(f"n{n}@example.com"))
                    conn.commit()
                    requests.append(key)
        except BaseException as exc:  # asserted below
            errors.append(exc)

    db_conn.execute("CREATE TABLE leasebox_app_log (id serial PRIMARY KEY)")
    db_conn.commit()
    producers = [threading.Thread(target=retry_requests, args=(n,)) for n in range(3)]
    for thread in producers:
        thread.start()
    try:
        for round_ in range(4):
            sent_days_ago(db_conn, 9 + round_, 2)
            wait_for(more_written(requests, len(requests) + 5), what="requests")
            assert prune_week(db_dsn).sent == 2
    finally:
        stop.set()
        for thread in producers:
            thread.join()
    assert errors == []


def dead_letters_days_ago(conn: psycopg.Connection[Any], days: int, count: int) -> list[int]:
    """`count` dead letters created `days` days ago, each with its history."""
    at = datetime.now(UTC) - timedelta(days=days)
    ids = [
        insert_message(
            conn,
            created_at=at,
            status="dead",
            dead_reason="rejected",
            kind="otp",
            recipient="ada@example.com",
            template="otp",
            delivery_key=f"otp:dead-{days}-{n}",
        )
        for n in range(count)
    ]
    conn.execute(
        "INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at)"
        " SELECT id, bucket, kind, 'dead', created_at FROM leasebox.outbox WHERE id = ANY(%s)",
        (ids,),
    )
    conn.commit()
    return ids


def versions(conn: psycopg.Connection[Any], ids: list[int]) -> dict[str, set[tuple[str, str]]]:
    """Where each row of these messages is and which version it is (its partition, xmin)."""
    found = {}
    for table, column in (("outbox", "id"), ("queue", "id"), ("history", "outbox_id")):
        statement = sql.SQL(
            "SELECT tableoid::regclass::text, xmin::text FROM {} WHERE {} = ANY(%s)"
        ).format(sql.Identifier("leasebox", table), sql.Identifier(column))
        found[table] = {(str(r[0]), str(r[1])) for r in conn.execute(statement, (ids,))}
    conn.rollback()
    return found


def test_prune_moves_the_rows_it_keeps_without_stopping_writers_and_never_moves_them_again(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    dead = dead_letters_days_ago(db_conn, 9, 50)
    sent_days_ago(db_conn, 9, 3)
    with psycopg.connect(db_dsn) as producer:
        # A request in flight holds the tables for longer than prune waits for them.
        enqueue(producer, otp(), idempotency_key="in-flight")
        with pytest.raises(DatabaseError, match="nothing was dropped"):
            prune_week(db_dsn)
        # The dead letters were moved out of their day all the same, by transactions of their
        # own that took no lock a writer waits for.
        moved = versions(db_conn, dead)
        producer.commit()
    assert {partition for partition, _ in moved["outbox"]} == {"leasebox.outbox_kept"}
    assert {partition for partition, _ in moved["history"]} == {"leasebox.history_kept"}

    first = prune_week(db_dsn)
    everything = prune(db_conn, retention_seconds=0, allow_short_retention=True)

    assert (first.sent, first.kept) == (3, 0)
    assert everything.kept == 0
    assert versions(db_conn, dead) == moved  # kept once, never moved again
    row = db_conn.execute(
        "SELECT count(*), min(status), max(dead_reason) FROM leasebox.messages WHERE id = ANY(%s)",
        (dead,),
    ).fetchone()
    assert row == (50, "dead", "rejected")


def test_a_kept_message_leaves_once_nothing_wanted_it_for_a_retention(
    db_conn: psycopg.Connection[Any],
) -> None:
    sent_long_ago, sent_lately, still_dead = dead_letters_days_ago(db_conn, 20, 3)
    prune(db_conn, retention_seconds=WEEK)
    # Two of them were requeued and sent: one ten days ago, one yesterday.
    for outbox_id, days in ((sent_long_ago, 10), (sent_lately, 1)):
        db_conn.execute("DELETE FROM leasebox.queue WHERE id = %s", (outbox_id,))
        db_conn.execute(
            "INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at)"
            " SELECT id, bucket, kind, 'sent', now() - make_interval(days => %s)"
            " FROM leasebox.outbox WHERE id = %s",
            (days, outbox_id),
        )
    # The abuse guard's subjects: one no send touched for ten days, one touched now.
    db_conn.execute(
        "INSERT INTO leasebox.guard_subjects VALUES (1, now() - interval '10 days'), (2, now())"
    )
    db_conn.commit()

    result = prune(db_conn, retention_seconds=WEEK)

    assert result.sent == 1
    left = db_conn.execute("SELECT id FROM leasebox.outbox ORDER BY id").fetchall()
    assert left == [(sent_lately,), (still_dead,)]
    gone = versions(db_conn, [sent_long_ago])
    assert gone == {"outbox": set(), "queue": set(), "history": set()}
    subjects = db_conn.execute("SELECT subject FROM leasebox.guard_subjects").fetchall()
    assert subjects == [(2,)]
