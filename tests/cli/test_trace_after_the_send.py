"""`leasebox trace` tells what happened after the send: the provider's events about it and
the suppression of its mailbox, and why a message to a suppressed mailbox was never sent."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import psycopg
import pytest

from leasebox.cli.main import main
from leasebox.feedback.events import HARD, EventType, FeedbackEvent
from leasebox.feedback.recording import record
from leasebox.store import claiming
from support.outbox_rows import insert_message

SENT = dt.datetime(2026, 12, 1, 12, 0, 1, tzinfo=dt.UTC)


def sent_message(conn: psycopg.Connection[Any], provider_id: str, recipient: str) -> int:
    outbox_id = insert_message(
        conn, status="sent", kind="otp", template="otp", recipient=recipient,
        recipient_key=recipient, scope="login", delivery_key=f"otp:{provider_id}",
        provider_message_id=provider_id, sent_at=SENT, created_at=SENT,
    )  # fmt: skip
    conn.commit()
    return outbox_id


def trace(capsys: pytest.CaptureFixture[str], dsn: str, *args: str) -> str:
    assert main(["trace", "--dsn", dsn, *args]) == 0
    return capsys.readouterr().out


def test_a_delivered_message_says_when_it_was_sent_and_delivered(
    db_conn: psycopg.Connection[Any], db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outbox_id = sent_message(db_conn, "re-1", "ada@example.org")
    delivered = FeedbackEvent(
        "re-1", "ada@example.org", EventType.DELIVERED, SENT + dt.timedelta(seconds=2)
    )
    record(db_conn, "resend", [delivered])
    db_conn.commit()

    text = trace(capsys, db_dsn, "--id", str(outbox_id))
    assert "after the send: sent 12:00:01, delivered 12:00:03" in text


def test_a_hard_bounce_says_its_status_and_that_the_address_is_suppressed(
    db_conn: psycopg.Connection[Any], db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outbox_id = sent_message(db_conn, "re-2", "gone@example.org")
    at = SENT + dt.timedelta(seconds=9)
    bounce = FeedbackEvent(
        "re-2", "gone@example.org", EventType.BOUNCED, at, bounce_class=HARD, smtp_status="5.1.1"
    )
    record(db_conn, "resend", [bounce])
    db_conn.commit()

    text = trace(capsys, db_dsn, "--id", str(outbox_id))
    answer = json.loads(trace(capsys, db_dsn, "--id", str(outbox_id), "--json"))
    told = "after the send: sent 12:00:01, bounced 5.1.1 (hard) 12:00:10, address suppressed"
    assert f"{told} (hard_bounce, 5.1.1, since" in text
    [send] = answer["sends"]
    assert send["feedback"][0]["smtp_status"] == "5.1.1"
    assert send["suppression"]["reason"] == "hard_bounce"
    assert "gone@example.org" not in text  # masked unless asked


def test_a_message_suppressed_when_claimed_says_why_it_was_never_sent(
    db_conn: psycopg.Connection[Any], db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db_conn.execute(
        "INSERT INTO leasebox.suppressions (scope, recipient_key, reason) VALUES"
        " ('login', 'gone@example.org', 'complaint')"
    )
    outbox_id = insert_message(db_conn, kind="otp", template="otp", recipient="gone@example.org",
                               recipient_key="gone@example.org", scope="login",
                               delivery_key="otp:never")  # fmt: skip
    db_conn.commit()

    async def claim() -> None:
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            await claiming.claim(conn, kinds=["otp"], limit=5, lease_seconds=45, worker_id="w1")

    asyncio.run(claim())
    text = trace(capsys, db_dsn, "--id", str(outbox_id))
    assert ", suppressed" in text.splitlines()[2]
    assert "not sent: the address is on the suppression list (complaint) (w1)" in text
    assert "attempts: none recorded" in text
    assert "address suppressed (complaint, since" in text
    assert "until lifted" in text
