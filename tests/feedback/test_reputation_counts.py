"""The hourly counts the receivers keep, as the operator reads them: a pool's providers are
those that reported on its kinds, each judged over everything it sent."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

from leasebox.feedback.events import HARD, EventType, FeedbackEvent
from leasebox.feedback.recording import record
from leasebox.store.reputation import fetch_reputation_async, judge

# When the events happened (the service's time): any time; what is counted is when they arrive.
AT = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


def event(message_id: str, kind: EventType, n: int, bounce: str | None = None) -> FeedbackEvent:
    return FeedbackEvent(message_id, f"user{n}@example.org", kind, AT + dt.timedelta(seconds=n),
                         bounce_class=bounce)  # fmt: skip


async def test_the_operator_reads_a_pools_providers_rates_from_the_hourly_counts(
    db_conn: psycopg.Connection[Any], db_dsn: str, sent: Any
) -> None:
    sent("ses-otp-1")  # an otp message of scope login, sent through SES
    delivered = [event("ses-otp-1", EventType.DELIVERED, n) for n in range(190)]
    bounced = [event("ses-otp-1", EventType.BOUNCED, n, HARD) for n in range(10)]
    record(db_conn, "ses", delivered + bounced)
    # Another provider's events about unknown messages: not this pool's provider.
    record(db_conn, "sendgrid", [event("sg-x", EventType.BOUNCED, n, HARD) for n in range(200)])
    db_conn.commit()

    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        mine = await fetch_reputation_async(conn, ["otp"])
        others = await fetch_reputation_async(conn, ["invite"])
    [ses] = mine
    assert (ses.provider, ses.delivered_1d, ses.bounced_1d, ses.delivered_7d) == (
        "ses",
        190,
        10,
        190,
    )
    assert ses.bounce_rate == 0.05
    assert judge(mine).healthy is True  # 5 % is the line, not over it
    assert others == []


def test_prune_deletes_the_events_older_than_the_retention_and_keeps_a_week_of_counts(
    now: dt.datetime,
    db_conn: psycopg.Connection[Any],
) -> None:
    from leasebox.store.pruning import prune

    old, recent = now - dt.timedelta(days=10), now - dt.timedelta(hours=1)
    record(db_conn, "ses", [event("old", EventType.DELIVERED, n) for n in range(3)], now=old)
    record(db_conn, "ses", [event("new", EventType.DELIVERED, n) for n in range(2)], now=recent)
    db_conn.commit()

    result = prune(db_conn, retention_seconds=3 * 86400)

    assert result.events == 3
    left = db_conn.execute("SELECT provider_message_id FROM leasebox.events").fetchall()
    hours = db_conn.execute("SELECT events FROM leasebox.feedback_hours").fetchall()
    assert left == [("new",), ("new",)]
    assert hours == [(2,)]
