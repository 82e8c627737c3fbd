"""The producer on a connection in autocommit mode: each send is a transaction of its own.

A plain `enqueue` is one statement there, atomic by itself. A plan of several steps (a guard's
count, a suppression check) holds advisory locks from its first step to its last, so it runs
in a transaction it opens itself: a lock dropped between two round trips would let a racing
request with the same key write a second send.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from leasebox import AbuseGuard, RateLimited, enqueue, enqueue_async
from leasebox.db.queries import DEFAULT_SCHEMA
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from leasebox.producer.plan import Plan, Step, one, run, run_async
from support.outbox_rows import count, otp

IDLE = psycopg.pq.TransactionStatus.IDLE


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


def advisory_locks(observer: psycopg.Connection[Any], pid: int) -> int:
    """How many advisory locks the backend `pid` holds, seen from another session."""
    row = observer.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND granted",
        [pid],
    ).fetchone()
    assert row is not None
    return int(row[0])


def two_step_plan(seen: Callable[[], int]) -> Plan[int]:
    """A plan that locks a key, then reports what `seen` observes before its last step."""
    yield Step((("lock_key", {"key": "first"}),))
    held = seen()
    yield one("lock_key", {"key": "last"}, final=True)
    return held


def test_a_plain_enqueue_on_an_autocommit_connection_commits_its_send_by_itself(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        receipt = enqueue(conn, otp(), idempotency_key="k1", scope="login")
        again = enqueue(conn, otp(), idempotency_key="k1", scope="login")
        assert conn.info.transaction_status == IDLE

    assert (again.outbox_id, again.reused) == (receipt.outbox_id, True)
    assert (count(db_conn, "outbox"), count(db_conn, "queue"), count(db_conn, "receipts")) == (
        1,
        1,
        1,
    )


def test_a_plan_of_several_steps_on_an_autocommit_connection_keeps_its_locks_to_the_last_step(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    db_conn.autocommit = True
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        held = run(
            conn,
            two_step_plan(lambda: advisory_locks(db_conn, conn.info.backend_pid)),
            DEFAULT_SCHEMA,
        )
        assert conn.info.transaction_status == IDLE
        released = advisory_locks(db_conn, conn.info.backend_pid)

    assert (held, released) == (1, 0)


async def test_an_async_plan_of_several_steps_on_an_autocommit_connection_keeps_its_locks(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    db_conn.autocommit = True
    async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        held = await run_async(
            conn, two_step_plan(lambda: advisory_locks(db_conn, pid)), DEFAULT_SCHEMA
        )
        assert conn.info.transaction_status == IDLE

    assert (held, advisory_locks(db_conn, pid)) == (1, 0)


def test_a_refused_request_on_an_autocommit_connection_writes_nothing_and_leaves_no_transaction(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    guard = AbuseGuard(per_recipient=1, per_scope=None, window_seconds=3600)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        enqueue(conn, otp(), idempotency_key="k1", scope="login", guard=guard)
        with pytest.raises(RateLimited):
            enqueue(conn, otp(), idempotency_key="k2", scope="login", guard=guard)
        assert conn.info.transaction_status == IDLE
        # The refused request's transaction ended: its locks are gone, nothing stays open.
        assert advisory_locks(db_conn, conn.info.backend_pid) == 0

    assert (count(db_conn, "outbox"), count(db_conn, "receipts")) == (1, 1)


async def test_a_suppression_checked_async_enqueue_on_an_autocommit_connection_commits_one_send(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
        first = await enqueue_async(
            conn, otp(), idempotency_key="k1", scope="login", check_suppression=True
        )
        again = await enqueue_async(
            conn, otp(), idempotency_key="k1", scope="login", check_suppression=True
        )
        assert conn.info.transaction_status == IDLE

    assert (again.outbox_id, again.reused) == (first.outbox_id, True)
    assert count(db_conn, "outbox") == 1


def test_a_plan_that_goes_on_after_its_final_step_is_refused(
    db_conn: psycopg.Connection[Any],
) -> None:
    def runaway() -> Plan[None]:
        yield one("lock_key", {"key": "a"}, final=True)
        yield one("lock_key", {"key": "b"})

    with pytest.raises(RuntimeError, match="after its final step"):
        run(db_conn, runaway(), DEFAULT_SCHEMA)
