"""A producer whose clock runs behind the database's.

Expiry is checked on the database's clock (every worker shares it). A producer whose clock
was 120 s behind enqueued OTPs valid for a minute that were already past their expiry on
that clock: they were written, never sent, and dead-lettered `expired`, and the producer was
never told. The producer's own check cannot see it; the write can: a message already past
its expiry on the database's clock is refused, with nothing written and the caller's
transaction intact.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox import AlreadyExpired, enqueue, enqueue_many
from leasebox import messages as messages_module
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from support.outbox_rows import count, otp


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


SKEW = timedelta(seconds=120)


class BehindClock(datetime):
    """`datetime` as a producer whose clock runs `SKEW` behind sees it."""

    @classmethod
    def now(cls, tz: Any = None) -> BehindClock:
        real = datetime.now(tz)
        return cls.fromtimestamp((real - SKEW).timestamp(), tz)


@pytest.fixture
def behind(monkeypatch: pytest.MonkeyPatch) -> datetime:
    """The producer's clock, 120 s behind the database's; returns its now."""
    monkeypatch.setattr(messages_module, "datetime", BehindClock)
    return BehindClock.now(UTC)


def test_a_message_already_expired_on_the_database_clock_is_refused_and_nothing_written(
    db_conn: psycopg.Connection[Any], behind: datetime
) -> None:
    message = otp(expires_at=behind + timedelta(seconds=60))
    with pytest.raises(AlreadyExpired) as caught:
        enqueue(db_conn, message, idempotency_key="login-1")
    assert isinstance(caught.value, ValueError)
    assert "database" in str(caught.value)
    db_conn.execute("SELECT 1")  # the transaction goes on
    db_conn.commit()
    assert (count(db_conn, "outbox"), count(db_conn, "receipts")) == (0, 0)


def test_a_message_still_valid_on_the_database_clock_is_written(
    db_conn: psycopg.Connection[Any], behind: datetime
) -> None:
    enqueue(db_conn, otp(expires_at=behind + timedelta(seconds=600)))
    db_conn.commit()
    assert count(db_conn, "outbox") == 1


def test_a_batch_with_a_message_already_expired_is_refused_whole(
    db_conn: psycopg.Connection[Any], behind: datetime
) -> None:
    batch = [
        otp(expires_at=behind + timedelta(seconds=600)),
        otp("bob@example.com", expires_at=behind + timedelta(seconds=60)),
    ]
    with pytest.raises(AlreadyExpired, match="#1"):
        enqueue_many(db_conn, batch)
    db_conn.commit()
    assert count(db_conn, "outbox") == 0
