"""The producer API writes in the caller's transaction and keeps one send per logical request."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox import (
    AbuseGuard,
    IdempotencyConflict,
    InvalidMessage,
    RateLimited,
    enqueue,
    enqueue_async,
)
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE, PayloadCipher, generate_key
from support.outbox_rows import count, otp


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about receipts and limits, not encryption: they opt in to plaintext."""
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")


def test_enqueue_writes_in_the_callers_transaction_and_never_commits(
    db_conn: psycopg.Connection[Any], db_dsn: str
) -> None:
    receipt = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    with psycopg.connect(db_dsn) as other:
        assert count(other, "outbox") == 0, "visible before the caller committed"
    db_conn.commit()
    with psycopg.connect(db_dsn) as other:
        assert count(other, "outbox") == 1
        assert count(other, "receipts") == 1
    assert receipt.reused is False


def test_a_rolled_back_transaction_leaves_no_row_and_no_receipt(
    db_conn: psycopg.Connection[Any],
) -> None:
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.rollback()
    assert count(db_conn, "outbox") == 0
    assert count(db_conn, "receipts") == 0


def test_a_retried_request_returns_the_first_send(db_conn: psycopg.Connection[Any]) -> None:
    first = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.commit()
    retried = enqueue(db_conn, otp(secrets={"code": "111111"}), idempotency_key="k1", scope="login")
    db_conn.commit()
    assert retried.reused is True
    assert retried.outbox_id == first.outbox_id
    assert retried.delivery_key == first.delivery_key
    assert count(db_conn, "outbox") == 1


def test_the_same_key_with_a_different_request_is_a_conflict(
    db_conn: psycopg.Connection[Any],
) -> None:
    enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    db_conn.commit()
    with pytest.raises(IdempotencyConflict) as caught:
        enqueue(db_conn, otp("eve@example.com"), idempotency_key="k1", scope="login")
    db_conn.rollback()
    assert "k1" in str(caught.value)
    assert "eve@example.com" not in str(caught.value)
    assert count(db_conn, "outbox") == 1


def test_the_same_key_in_another_scope_is_another_send(db_conn: psycopg.Connection[Any]) -> None:
    a = enqueue(db_conn, otp(), idempotency_key="k1", scope="login")
    b = enqueue(db_conn, otp(), idempotency_key="k1", scope="signup")
    db_conn.commit()
    assert a.outbox_id != b.outbox_id
    assert a.delivery_key != b.delivery_key


def test_an_explicit_delivery_key_already_present_is_the_same_send(
    db_conn: psycopg.Connection[Any],
) -> None:
    a = enqueue(db_conn, otp(delivery_key="otp:user-1:challenge-9"))
    b = enqueue(db_conn, otp(delivery_key="otp:user-1:challenge-9"))
    db_conn.commit()
    assert (b.outbox_id, b.reused) == (a.outbox_id, True)


def test_an_expired_receipt_lets_the_key_start_a_new_send(db_conn: psycopg.Connection[Any]) -> None:
    first = enqueue(db_conn, otp(), idempotency_key="k1", scope="login", receipt_ttl_seconds=0)
    db_conn.commit()
    second = enqueue(db_conn, otp("eve@example.com"), idempotency_key="k1", scope="login")
    db_conn.commit()
    assert second.reused is False
    assert second.outbox_id != first.outbox_id


def test_racing_requests_with_one_key_produce_exactly_one_row(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    racers = 24
    barrier = threading.Barrier(racers)
    outcomes: list[tuple[str, int]] = []
    unexpected: list[BaseException] = []

    def request(i: int) -> None:
        # Half of the racers send a different body: they must get a conflict, nothing else.
        message = otp() if i % 2 == 0 else otp("eve@example.com")
        try:
            with psycopg.connect(db_dsn) as conn:
                barrier.wait()
                receipt = enqueue(conn, message, idempotency_key="race", scope="login")
                conn.commit()
                outcomes.append(("reused" if receipt.reused else "new", receipt.outbox_id))
        except IdempotencyConflict as exc:
            outcomes.append(("conflict", exc.outbox_id))
        except BaseException as exc:  # collected and asserted below
            unexpected.append(exc)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert unexpected == []
    assert count(db_conn, "outbox") == 1
    assert count(db_conn, "receipts") == 1
    kinds = [kind for kind, _ in outcomes]
    assert kinds.count("new") == 1
    assert len({outbox_id for _, outbox_id in outcomes}) == 1
    # Whichever body won, the racers with the other body conflict and the rest reuse.
    assert kinds.count("conflict") == racers // 2
    assert kinds.count("reused") == racers // 2 - 1


def test_the_abuse_guard_limits_sends_per_recipient(db_conn: psycopg.Connection[Any]) -> None:
    guard = AbuseGuard(per_recipient=3, window_seconds=600)
    for i in range(3):
        enqueue(db_conn, otp(), idempotency_key=f"k{i}", scope="login", guard=guard)
    with pytest.raises(RateLimited) as caught:
        enqueue(db_conn, otp("ADA@example.com"), idempotency_key="k3", scope="login", guard=guard)
    assert 0 < caught.value.retry_after <= 600
    db_conn.rollback()


def test_a_reused_receipt_never_counts_against_the_guard(db_conn: psycopg.Connection[Any]) -> None:
    guard = AbuseGuard(per_recipient=1, window_seconds=600)
    first = enqueue(db_conn, otp(), idempotency_key="k1", scope="login", guard=guard)
    again = enqueue(db_conn, otp(), idempotency_key="k1", scope="login", guard=guard)
    assert again.outbox_id == first.outbox_id
    with pytest.raises(RateLimited):
        enqueue(db_conn, otp(), idempotency_key="k2", scope="login", guard=guard)
    db_conn.rollback()


def test_the_abuse_guard_limits_sends_per_scope(db_conn: psycopg.Connection[Any]) -> None:
    guard = AbuseGuard(per_scope=2, window_seconds=600)
    enqueue(db_conn, otp("a@example.com"), idempotency_key="k1", scope="tenant-1", guard=guard)
    enqueue(db_conn, otp("b@example.com"), idempotency_key="k2", scope="tenant-1", guard=guard)
    enqueue(db_conn, otp("c@example.com"), idempotency_key="k3", scope="tenant-2", guard=guard)
    with pytest.raises(RateLimited, match="per-scope"):
        enqueue(db_conn, otp("d@example.com"), idempotency_key="k4", scope="tenant-1", guard=guard)
    db_conn.rollback()


def test_the_abuse_guard_holds_under_concurrency(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    guard = AbuseGuard(per_recipient=5, window_seconds=600)
    racers = 16
    barrier = threading.Barrier(racers)
    accepted: list[int] = []
    limited: list[int] = []
    unexpected: list[BaseException] = []

    def request(i: int) -> None:
        try:
            with psycopg.connect(db_dsn) as conn:
                barrier.wait()
                enqueue(conn, otp(), idempotency_key=f"k{i}", scope="login", guard=guard)
                conn.commit()
                accepted.append(i)
        except RateLimited:
            limited.append(i)
        except BaseException as exc:  # collected and asserted below
            unexpected.append(exc)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert unexpected == []
    assert len(accepted) == 5
    assert len(limited) == racers - 5
    assert count(db_conn, "outbox") == 5


def test_secrets_are_encrypted_at_rest_when_keys_are_set(db_conn: psycopg.Connection[Any]) -> None:
    old_key, new_key = generate_key(), generate_key()
    enqueue(db_conn, otp(), cipher=PayloadCipher([old_key]))
    db_conn.commit()
    row = db_conn.execute("SELECT secrets FROM leasebox.outbox").fetchone()
    assert row is not None
    stored = bytes(row[0])
    assert b"493817" not in stored
    rotated = PayloadCipher([new_key, old_key])
    assert rotated.open(stored) == {"code": "493817"}


def test_messages_expiring_in_the_past_are_rejected_before_writing() -> None:
    with pytest.raises(InvalidMessage, match="expires_at"):
        otp(expires_at=datetime.now(UTC) - timedelta(seconds=1))


async def test_enqueue_async_has_the_same_receipt_semantics(db_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        first = await enqueue_async(conn, otp(), idempotency_key="k1", scope="login")
        await conn.commit()
        again = await enqueue_async(conn, otp(), idempotency_key="k1", scope="login")
        await conn.commit()
        with pytest.raises(IdempotencyConflict):
            await enqueue_async(conn, otp("eve@example.com"), idempotency_key="k1", scope="login")
        await conn.rollback()
        cur = await conn.execute("SELECT count(*) FROM leasebox.outbox")
        row = await cur.fetchone()
    assert again.reused
    assert again.outbox_id == first.outbox_id
    assert row == (1,)


async def test_concurrent_async_producers_share_one_row(db_dsn: str) -> None:
    async def request() -> int:
        async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
            receipt = await enqueue_async(conn, otp(), idempotency_key="same", scope="login")
            await conn.commit()
            return receipt.outbox_id

    ids = await asyncio.gather(*(request() for _ in range(10)))
    assert len(set(ids)) == 1
