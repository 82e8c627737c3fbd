"""What a receipt records of the requests that mapped onto its send: the latest sighting
(`last_seen_at`) and how many retried requests reused it (`reuse_count`), on both paths of
`enqueue` (the single statement, and the abuse guard's lookup that returns early)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from leasebox import AbuseGuard, IdempotencyConflict, enqueue, enqueue_many
from leasebox.db.queries import query
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from support.outbox_rows import otp
from support.plans import analyze, full_scans, indexes, plan_of, reads

GUARDS = {"unguarded": None, "guarded": AbuseGuard(per_recipient=100, window_seconds=600)}


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")


def bookkeeping(conn: psycopg.Connection[Any], key: str) -> tuple[int, bool, bool]:
    """(reuse_count, last_seen_at is set, last_seen_at is later than created_at)."""
    row = conn.execute(
        "SELECT reuse_count, last_seen_at IS NOT NULL, last_seen_at > created_at "
        "FROM leasebox.receipts WHERE idempotency_key = %s",
        (key,),
    ).fetchone()
    assert row is not None
    return int(row[0]), bool(row[1]), bool(row[2])


@pytest.mark.parametrize("guard", GUARDS.values(), ids=GUARDS.keys())
def test_three_retried_requests_count_three_reuses_and_move_the_last_sighting(
    db_conn: psycopg.Connection[Any], guard: AbuseGuard | None
) -> None:
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login", guard=guard)
    db_conn.commit()
    assert bookkeeping(db_conn, "k1") == (0, True, False)
    db_conn.commit()
    for _ in range(3):
        receipt = enqueue(db_conn, otp(), idempotency_key="k1", scope="login", guard=guard)
        db_conn.commit()
        assert receipt.reused
    assert bookkeeping(db_conn, "k1") == (3, True, True)


@pytest.mark.parametrize("guard", GUARDS.values(), ids=GUARDS.keys())
def test_a_conflicting_request_is_not_counted_as_a_reuse(
    db_conn: psycopg.Connection[Any], guard: AbuseGuard | None
) -> None:
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login", guard=guard)
    db_conn.commit()
    with pytest.raises(IdempotencyConflict):
        enqueue(db_conn, otp("bob@example.com"), idempotency_key="k1", scope="login", guard=guard)
    db_conn.commit()
    assert bookkeeping(db_conn, "k1")[0] == 0


@pytest.mark.parametrize("guard", GUARDS.values(), ids=GUARDS.keys())
def test_a_receipt_replaced_after_its_expiry_starts_counting_again(
    db_conn: psycopg.Connection[Any], guard: AbuseGuard | None
) -> None:
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.commit()
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.commit()
    assert bookkeeping(db_conn, "k1")[0] == 1
    db_conn.execute("UPDATE leasebox.receipts SET expires_at = now() - interval '1 second'")
    db_conn.commit()
    fresh = enqueue(db_conn, otp(), idempotency_key="k1", scope="login", guard=guard)
    db_conn.commit()
    assert not fresh.reused
    assert bookkeeping(db_conn, "k1") == (0, True, False)


def test_a_receipt_a_batch_writes_over_an_expired_one_starts_counting_again(
    db_conn: psycopg.Connection[Any],
) -> None:
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.execute("UPDATE leasebox.receipts SET expires_at = now() - interval '1 second'")
    db_conn.commit()
    [fresh] = enqueue_many(db_conn, [otp()], idempotency_keys=["k1"], scope="login")
    db_conn.commit()
    assert not fresh.reused
    assert bookkeeping(db_conn, "k1") == (0, True, False)
    row = db_conn.execute("SELECT count(*), max(outbox_id) FROM leasebox.receipts").fetchone()
    assert row == (1, fresh.outbox_id)


def test_a_batch_counts_the_reuses_of_its_receipts(db_conn: psycopg.Connection[Any]) -> None:
    enqueue_many(db_conn, [otp(), otp("bob@example.com")], idempotency_keys=["a", "b"])
    db_conn.commit()
    enqueue_many(db_conn, [otp()], idempotency_keys=["a"])
    db_conn.commit()
    enqueue(db_conn, otp(), idempotency_key="a")
    db_conn.commit()
    assert bookkeeping(db_conn, "a") == (2, True, True)
    assert bookkeeping(db_conn, "b") == (0, True, False)


def test_racing_retries_of_one_request_write_one_row_and_count_every_reuse(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    racers = 16
    barrier = threading.Barrier(racers)
    answers: list[bool] = []
    surprises: list[BaseException] = []

    def request() -> None:
        barrier.wait()
        try:
            with psycopg.connect(db_dsn) as conn:
                receipt = enqueue(conn, otp(), idempotency_key="race", scope="login")
                conn.commit()
            answers.append(receipt.reused)
        except BaseException as exc:  # asserted below
            surprises.append(exc)

    threads = [threading.Thread(target=request) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert surprises == []
    assert sorted(answers) == [False] + [True] * (racers - 1)
    row = db_conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone()
    assert row is not None
    assert row[0] == 1
    assert bookkeeping(db_conn, "race")[0] == racers - 1


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh rows", "analyzed"])
def test_the_guarded_lookup_finds_a_receipts_message_by_its_key_not_by_scanning_the_outbox(
    db_conn: psycopg.Connection[Any], analyzed: bool
) -> None:
    keys = [f"request-{i}" for i in range(3000)]
    messages = [otp(f"user{i}@example.com") for i in range(3000)]
    enqueue_many(db_conn, messages, idempotency_keys=keys, scope="s")
    db_conn.commit()
    if analyzed:
        db_conn.execute("ANALYZE leasebox.outbox, leasebox.receipts")
        db_conn.commit()
    params = {"scope": "s", "idempotency_key": keys[7], "request_hash": "any"}
    found = plan_of(db_conn, query("find_receipt"), params)
    assert not [s for s in full_scans(db_conn, found) if "outbox" in s], reads(found)
    assert {"outbox_pkey", "receipts_pkey"} <= indexes(db_conn, found)


# A burst's receipts, written after the connection's first send (its plans are made then).
FILLED_RECEIPTS = """
INSERT INTO leasebox.receipts
    (scope, idempotency_key, bucket, request_hash, outbox_id, outbox_bucket, expires_at)
SELECT 'login', 'filled-' || g, ((now() + interval '1 day') AT TIME ZONE 'UTC')::date, 'h', g,
       (now() AT TIME ZONE 'UTC')::date, now() + interval '1 day'
FROM generate_series(1, 3000) AS g
"""


def test_a_receipt_partition_analysed_while_empty_is_still_read_by_its_key_once_it_fills(
    db_conn: psycopg.Connection[Any],
) -> None:
    # Statistics that call the partitions empty (an ANALYZE before the day's first send) and
    # a burst that fills one before autovacuum analyses it again: the function's plans must
    # not scan the filled partition for every send.
    analyze(db_conn, "receipts")
    plans: list[str] = []
    db_conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    db_conn.execute("LOAD 'auto_explain'")
    enqueue(db_conn, otp(), idempotency_key="first", scope="login")
    db_conn.commit()
    db_conn.execute(FILLED_RECEIPTS)
    db_conn.commit()
    for name, value in (
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_level", "notice"),
    ):
        db_conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    enqueue(db_conn, otp("bob@example.com"), idempotency_key="second", scope="login")
    db_conn.commit()

    lookups = [p for p in plans if "receipts" in p and "idempotency_key" in p]
    assert lookups, plans
    assert not [p for p in lookups if "Seq Scan on receipts" in p], lookups
