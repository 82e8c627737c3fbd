"""Requests that share an idempotency key while one of them is still uncommitted.

`enqueue` and `enqueue_many` serialise on the key's advisory lock (a batch takes the locks of
all its keys at once), so a statement that runs after the lock sees what the holder committed.
Each test holds the first request open, proves that the second one waits for it, then ends
the first and checks that exactly one send exists and that the second request got the answer
it should: the same send, a conflict, or a send of its own.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from leasebox import IdempotencyConflict, Receipt, enqueue, enqueue_many
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from support.outbox_rows import count, otp
from support.waiting import second_while_first_is_open

KEY = "signup-42"
SCOPE = "login"


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


def request(conn: psycopg.Connection[Any], recipient: str = "ada@example.com") -> Receipt:
    """The API request under test: an OTP for `recipient` under the key `KEY`."""
    return enqueue(conn, otp(recipient), idempotency_key=KEY, scope=SCOPE)


def test_a_request_waits_for_an_uncommitted_one_with_its_key_and_gets_its_send(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    first = psycopg.connect(db_dsn)
    winner = request(first)

    receipt = second_while_first_is_open(db_dsn, db_conn, first, request)

    assert not isinstance(receipt, BaseException), repr(receipt)
    assert (receipt.outbox_id, receipt.reused) == (winner.outbox_id, True)
    assert count(db_conn, "outbox") == 1
    assert count(db_conn, "receipts") == 1


def test_a_request_whose_uncommitted_rival_rolls_back_sends_on_its_own(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    first = psycopg.connect(db_dsn)
    loser = request(first)

    receipt = second_while_first_is_open(
        db_dsn,
        db_conn,
        first,
        request,
        commit_first=False,
    )

    assert not isinstance(receipt, BaseException), repr(receipt)
    assert receipt.reused is False
    assert receipt.outbox_id != loser.outbox_id
    assert count(db_conn, "outbox") == 1


def test_another_request_under_the_key_of_an_uncommitted_one_is_a_conflict(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    first = psycopg.connect(db_dsn)
    winner = request(first)

    answer = second_while_first_is_open(
        db_dsn,
        db_conn,
        first,
        lambda c: request(c, "eve@example.com"),
    )

    assert isinstance(answer, IdempotencyConflict)
    assert answer.outbox_id == winner.outbox_id
    assert count(db_conn, "outbox") == 1


def test_a_batch_waits_for_an_uncommitted_request_with_one_of_its_keys(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    first = psycopg.connect(db_dsn)
    winner = request(first)

    receipts = second_while_first_is_open(
        db_dsn,
        db_conn,
        first,
        lambda c: enqueue_many(
            c, [otp(), otp("bob@example.com")], idempotency_keys=[KEY, "other"], scope=SCOPE
        ),
    )

    assert not isinstance(receipts, BaseException), repr(receipts)
    assert (receipts[0].outbox_id, receipts[0].reused) == (winner.outbox_id, True)
    assert receipts[1].reused is False
    assert count(db_conn, "outbox") == 2
    assert count(db_conn, "receipts") == 2


def test_a_request_waits_for_an_uncommitted_batch_holding_its_key(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    first = psycopg.connect(db_dsn)
    [winner, _] = enqueue_many(
        first, [otp(), otp("bob@example.com")], idempotency_keys=[KEY, "other"], scope=SCOPE
    )

    receipt = second_while_first_is_open(db_dsn, db_conn, first, request)

    assert not isinstance(receipt, BaseException), repr(receipt)
    assert (receipt.outbox_id, receipt.reused) == (winner.outbox_id, True)
    assert count(db_conn, "outbox") == 2
