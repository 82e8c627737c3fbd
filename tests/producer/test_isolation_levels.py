"""The producer's guarantees at every isolation level an application may run its request in.

An application whose request transaction is REPEATABLE READ or SERIALIZABLE (common in
Django and SQLAlchemy setups) takes its snapshot at its first statement, usually a business
statement before `enqueue`: whatever a concurrent request commits after that is invisible to
it, however long it waits for a lock. Each test here runs concurrent requests on real
connections, each one a business statement and then `enqueue`, released together, at each
level; a request that loses a race at the stricter levels fails with a serialization failure
(SQLSTATE 40001), which the application retries as it retries any at those levels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import IsolationLevel
from psycopg.errors import SerializationFailure

from leasebox import AbuseGuard, RateLimited, enqueue
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from support.outbox_rows import count, otp


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


LEVELS = [
    pytest.param(IsolationLevel.READ_COMMITTED, id="read-committed"),
    pytest.param(IsolationLevel.REPEATABLE_READ, id="repeatable-read"),
    pytest.param(IsolationLevel.SERIALIZABLE, id="serializable"),
]
RACERS = 8


def racing_requests(
    db_dsn: str, level: IsolationLevel, request: Callable[[psycopg.Connection[Any]], str]
) -> list[str]:
    """Run `request` in `RACERS` transactions at `level`, each after a business statement,
    released together once every snapshot is taken; what each answered, or `serialization`."""
    snapshots_taken = threading.Barrier(RACERS)
    answers: list[str] = []
    unexpected: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(db_dsn) as conn:
                conn.isolation_level = level
                conn.execute("INSERT INTO challenges DEFAULT VALUES")  # the business change
                snapshots_taken.wait()
                try:
                    answer = request(conn)
                    conn.commit()
                except SerializationFailure:
                    conn.rollback()
                    answer = "serialization"
                answers.append(answer)
        except BaseException as exc:  # asserted by the caller
            unexpected.append(exc)
            snapshots_taken.abort()

    threads = [threading.Thread(target=run) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert unexpected == []
    return answers


@pytest.fixture
def challenges(db_conn: psycopg.Connection[Any]) -> None:
    """The application's own table, written before `enqueue` in each request."""
    db_conn.execute("CREATE TABLE challenges (id serial PRIMARY KEY)")
    db_conn.commit()


def guarded_request(guard: AbuseGuard, **enqueue_options: Any) -> Callable[..., str]:
    def request(conn: psycopg.Connection[Any]) -> str:
        try:
            enqueue(conn, otp(), guard=guard, **enqueue_options)
        except RateLimited:
            return "limited"
        return "accepted"

    return request


@pytest.mark.usefixtures("challenges")
@pytest.mark.parametrize("level", LEVELS)
def test_the_per_recipient_limit_holds_against_concurrent_requests_at_every_isolation_level(
    db_dsn: str, db_conn: psycopg.Connection[Any], level: IsolationLevel
) -> None:
    guard = AbuseGuard(per_recipient=2, window_seconds=600)
    answers = racing_requests(db_dsn, level, guarded_request(guard))
    accepted = answers.count("accepted")
    assert accepted <= 2, answers
    assert count(db_conn, "outbox") == accepted
    # Each request either went through, was refused, or lost a race it may retry.
    assert set(answers) <= {"accepted", "limited", "serialization"}
    if level is IsolationLevel.READ_COMMITTED:
        assert sorted(answers) == ["accepted"] * 2 + ["limited"] * (RACERS - 2)


@pytest.mark.usefixtures("challenges")
@pytest.mark.parametrize("level", LEVELS)
def test_the_per_scope_limit_holds_against_concurrent_requests_at_every_isolation_level(
    db_dsn: str, db_conn: psycopg.Connection[Any], level: IsolationLevel
) -> None:
    guard = AbuseGuard(per_scope=3, window_seconds=600)
    answers = racing_requests(db_dsn, level, guarded_request(guard, scope="tenant-a"))
    assert answers.count("accepted") <= 3, answers
    assert count(db_conn, "outbox") == answers.count("accepted")


@pytest.mark.usefixtures("challenges")
@pytest.mark.parametrize("level", LEVELS)
def test_requests_retried_after_a_serialization_failure_end_exactly_at_the_limit(
    db_dsn: str, db_conn: psycopg.Connection[Any], level: IsolationLevel
) -> None:
    """What an application that retries serialization failures sees: READ COMMITTED's answer."""
    guard = AbuseGuard(per_recipient=2, window_seconds=600)
    request = guarded_request(guard)

    def retried(conn: psycopg.Connection[Any]) -> str:
        for _ in range(RACERS * 4):
            try:
                answer = request(conn)
                conn.commit()
            except SerializationFailure:
                conn.rollback()
                conn.execute("INSERT INTO challenges DEFAULT VALUES")  # the request again
                continue
            return answer
        return "gave up"

    answers = racing_requests(db_dsn, level, retried)
    assert sorted(answers) == ["accepted"] * 2 + ["limited"] * (RACERS - 2)
    assert count(db_conn, "outbox") == 2


@pytest.mark.usefixtures("challenges")
@pytest.mark.parametrize("level", LEVELS)
def test_concurrent_requests_with_one_idempotency_key_make_one_send_at_every_isolation_level(
    db_dsn: str, db_conn: psycopg.Connection[Any], level: IsolationLevel
) -> None:
    def request(conn: psycopg.Connection[Any]) -> str:
        receipt = enqueue(conn, otp(), idempotency_key="request-1", scope="login")
        return "reused" if receipt.reused else "new"

    answers = racing_requests(db_dsn, level, request)
    assert answers.count("new") <= 1, answers
    assert set(answers) <= {"new", "reused", "serialization"}
    assert count(db_conn, "outbox") == answers.count("new")
    assert count(db_conn, "receipts") == answers.count("new")
