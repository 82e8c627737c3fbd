"""What the producer promises under attack and under races: limits that letter case cannot
bypass, one delivery key for one message, receipts that keep their message and never map a
request onto a message that is gone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox import AbuseGuard, IdempotencyConflict, RateLimited, enqueue
from leasebox.cli.main import main
from leasebox.errors import ConfigurationError
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from leasebox.store.dead_letters import DeadLetterFilter, purge_dead_letters
from leasebox.store.pruning import prune
from support.outbox_rows import count, insert_message, otp
from support.waiting import wait_for, waiting_on_a_lock


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


def race(racers: int, request: Callable[[int], str]) -> tuple[list[str], list[BaseException]]:
    """Run `request(i)` in `racers` threads released together; their answers and surprises."""
    barrier = threading.Barrier(racers)
    answers: list[str] = []
    unexpected: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            answers.append(request(i))
        except BaseException as exc:  # collected and asserted by the caller
            unexpected.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers, unexpected


# -- letter case and the abuse guard ------------------------------------------------------------

VARIANTS = (
    "Mixed@Example.com",
    "mixed@example.com",
    "MIXED@EXAMPLE.COM",
    "mixed@Example.COM",
    "mIxEd@eXaMpLe.cOm",
)


def test_letter_case_does_not_bypass_the_per_recipient_limit(
    db_conn: psycopg.Connection[Any],
) -> None:
    guard = AbuseGuard(per_recipient=2, window_seconds=600)
    accepted, limited = 0, 0
    for variant in VARIANTS:
        try:
            enqueue(db_conn, otp(variant), guard=guard)
            accepted += 1
        except RateLimited:
            limited += 1
    db_conn.commit()
    assert (accepted, limited) == (2, 3)
    assert count(db_conn, "outbox") == 2


def test_surrounding_spaces_are_trimmed_and_do_not_make_another_recipient(
    db_conn: psycopg.Connection[Any],
) -> None:
    guard = AbuseGuard(per_recipient=1, window_seconds=600)
    enqueue(db_conn, otp("Mixed@Example.com"), guard=guard)
    with pytest.raises(RateLimited):
        enqueue(db_conn, otp(" mixed@example.com\t"), guard=guard)
    db_conn.rollback()


def test_the_address_is_sent_as_given_and_counted_in_its_normalised_form(
    db_conn: psycopg.Connection[Any],
) -> None:
    enqueue(db_conn, otp(" Mixed@Bücher.DE "))
    db_conn.commit()
    row = db_conn.execute("SELECT recipient, recipient_key FROM leasebox.outbox").fetchone()
    assert row == ("Mixed@Bücher.DE", "mixed@xn--bcher-kva.de")


def test_an_internationalised_domain_and_its_ascii_form_are_one_recipient(
    db_conn: psycopg.Connection[Any],
) -> None:
    guard = AbuseGuard(per_recipient=1, window_seconds=600)
    enqueue(db_conn, otp("Ada@XN--BCHER-KVA.DE"), guard=guard)
    with pytest.raises(RateLimited, match="per-recipient"):
        enqueue(db_conn, otp("ada@Bücher.de"), guard=guard)
    db_conn.rollback()


def test_racers_on_letter_case_variants_share_one_limit(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    guard = AbuseGuard(per_recipient=3, window_seconds=600)

    def request(i: int) -> str:
        try:
            with psycopg.connect(db_dsn) as conn:
                enqueue(conn, otp(VARIANTS[i % len(VARIANTS)]), guard=guard)
                conn.commit()
        except RateLimited:
            return "limited"
        return "accepted"

    answers, unexpected = race(16, request)
    assert unexpected == []
    assert answers.count("accepted") == 3
    assert answers.count("limited") == 13
    assert count(db_conn, "outbox") == 3


def test_the_per_scope_limit_holds_without_an_idempotency_key(
    db_conn: psycopg.Connection[Any],
) -> None:
    guard = AbuseGuard(per_scope=2, window_seconds=600)
    enqueue(db_conn, otp("a@example.com"), scope="tenant-1", guard=guard)
    enqueue(db_conn, otp("b@example.com"), scope="tenant-1", guard=guard, idempotency_key="k")
    enqueue(db_conn, otp("c@example.com"), scope="tenant-2", guard=guard)
    with pytest.raises(RateLimited, match="per-scope"):
        enqueue(db_conn, otp("d@example.com"), scope="tenant-1", guard=guard)
    db_conn.rollback()


def test_a_request_reusing_its_delivery_key_never_counts_against_the_guard(
    db_conn: psycopg.Connection[Any],
) -> None:
    guard = AbuseGuard(per_recipient=1, window_seconds=600)
    first = enqueue(db_conn, otp(delivery_key="otp:user-1:c1"), guard=guard)
    again = enqueue(db_conn, otp(delivery_key="otp:user-1:c1"), guard=guard)
    assert (again.outbox_id, again.reused) == (first.outbox_id, True)
    db_conn.rollback()


# -- one delivery key, one message --------------------------------------------------------------


def test_a_second_enqueue_of_a_delivery_key_that_is_not_yet_committed_gets_its_receipt(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    key = "otp:user-1:challenge-7"
    first = psycopg.connect(db_dsn)
    winner = enqueue(first, otp(delivery_key=key))
    answers: list[object] = []

    def second() -> None:
        try:
            with psycopg.connect(db_dsn, application_name="second-producer") as conn:
                answers.append(enqueue(conn, otp(delivery_key=key)))
                conn.commit()
        except BaseException as exc:  # asserted below
            answers.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    try:
        wait_for(  # the second waits for the first's row
            lambda: waiting_on_a_lock(db_conn, "second-producer"),
            what="the second producer to wait for the first",
            timeout=30,
        )
        first.commit()
    finally:
        thread.join(timeout=30)
        first.close()
    [receipt] = answers
    assert not isinstance(receipt, BaseException), repr(receipt)
    assert getattr(receipt, "outbox_id", None) == winner.outbox_id
    assert getattr(receipt, "reused", None) is True
    assert count(db_conn, "outbox") == 1


def test_racing_enqueues_of_one_delivery_key_all_get_a_receipt_for_one_row(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    ids: list[int] = []

    def request(_: int) -> str:
        with psycopg.connect(db_dsn) as conn:
            receipt = enqueue(conn, otp(delivery_key="otp:user-1:race"))
            conn.commit()
        ids.append(receipt.outbox_id)
        return "reused" if receipt.reused else "new"

    answers, unexpected = race(24, request)
    assert unexpected == []
    assert answers.count("new") == 1
    assert len(set(ids)) == 1
    assert count(db_conn, "outbox") == 1


@pytest.mark.parametrize("guarded", [False, True], ids=["unguarded", "guarded"])
def test_a_different_message_under_an_existing_delivery_key_is_a_conflict(
    db_conn: psycopg.Connection[Any], guarded: bool
) -> None:
    guard = AbuseGuard(per_recipient=10) if guarded else None
    first = enqueue(db_conn, otp(delivery_key="otp:user-1:c9"), guard=guard)
    db_conn.commit()
    with pytest.raises(IdempotencyConflict) as caught:
        enqueue(
            db_conn,
            otp("eve@example.com", delivery_key="otp:user-1:c9"),
            idempotency_key="eve-request",
            scope="login",
            guard=guard,
        )
    db_conn.commit()  # a caller that swallows the conflict commits nothing of it
    assert caught.value.outbox_id == first.outbox_id
    assert caught.value.delivery_key == "otp:user-1:c9"
    assert "delivery key 'otp:user-1:c9'" in str(caught.value)
    assert "eve@example.com" not in str(caught.value)
    assert count(db_conn, "outbox") == 1
    assert count(db_conn, "receipts") == 0


# -- receipts and the rows they point at -----------------------------------------------------


def test_a_receipt_goes_with_its_row_so_a_retry_after_a_purge_is_a_new_send(
    db_conn: psycopg.Connection[Any],
) -> None:
    first = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.execute("UPDATE leasebox.queue SET status = 'dead', dead_reason = 'rejected'")
    db_conn.commit()
    assert purge_dead_letters(db_conn, DeadLetterFilter()) == 1
    assert count(db_conn, "receipts") == 0
    retried = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.commit()
    assert retried.reused is False
    assert retried.outbox_id != first.outbox_id
    assert retried.delivery_key.startswith("otp:")


def test_prune_keeps_an_old_sent_message_while_a_live_receipt_names_it(
    db_conn: psycopg.Connection[Any],
) -> None:
    eight_days_ago = datetime.now(UTC) - timedelta(days=8)
    wanted, forgotten = (
        insert_message(
            db_conn,
            status="sent",
            sent_at=eight_days_ago,
            kind="otp",
            recipient="ada@example.com",
            template="otp",
            delivery_key=key,
        )
        for key in ("otp:challenge-1", "otp:challenge-2")
    )
    db_conn.commit()
    # Requests that reuse the messages' delivery keys today get receipts for them.
    first = enqueue(db_conn, otp(delivery_key="otp:challenge-1"), idempotency_key="k1")
    enqueue(db_conn, otp(delivery_key="otp:challenge-2"), idempotency_key="k2")
    db_conn.execute(
        "UPDATE leasebox.receipts SET expires_at = now() - interval '1 second'"
        " WHERE idempotency_key = 'k2'"
    )
    db_conn.commit()
    assert (first.outbox_id, first.reused) == (wanted, True)

    result = prune(db_conn, retention_seconds=7 * 86400)

    assert (result.sent, result.kept) == (1, 1)
    retried = enqueue(db_conn, otp(delivery_key="otp:challenge-1"), idempotency_key="k1")
    assert (retried.outbox_id, retried.reused) == (wanted, True)
    remaining = db_conn.execute("SELECT id, status FROM leasebox.messages").fetchall()
    assert remaining == [(wanted, "sent")]
    assert forgotten != wanted


def test_prune_refuses_a_retention_shorter_than_the_receipt_ttl_unless_allowed(
    db_conn: psycopg.Connection[Any], db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigurationError, match=r"retention of 1h is shorter than the receipt"):
        prune(db_conn, retention_seconds=3600)
    assert prune(db_conn, retention_seconds=3600, allow_short_retention=True).sent == 0
    assert prune(db_conn, retention_seconds=3600, receipt_ttl_seconds=600).sent == 0
    assert main(["prune", "--dsn", db_dsn, "--retention", "1h"]) == 2
    assert "--allow-short-retention" in capsys.readouterr().err
    assert main(["prune", "--dsn", db_dsn, "--retention", "1h", "--receipt-ttl", "30m"]) == 0
    assert main(["prune", "--dsn", db_dsn, "--retention", "1h", "--allow-short-retention"]) == 0


def test_a_request_whose_message_was_deleted_by_hand_is_a_new_send_with_a_receipt(
    db_conn: psycopg.Connection[Any],
) -> None:
    first = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.commit()
    db_conn.execute("DELETE FROM leasebox.queue")
    db_conn.execute("DELETE FROM leasebox.outbox")
    db_conn.commit()
    again = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.commit()
    assert again.reused is False
    assert again.outbox_id != first.outbox_id
    # The receipt now names the new send, so the next retry is that send, not a third one.
    retried = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    assert (retried.outbox_id, retried.reused) == (again.outbox_id, True)
    assert count(db_conn, "receipts") == 1
