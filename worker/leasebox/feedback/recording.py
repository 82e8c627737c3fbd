"""Storing a request's events: once each, linked to their messages, in one statement.

`record_events` (queries.sql) does it all in the caller's connection and transaction:
remembers a signed token (a replay is refused, and stores nothing), links each event to the
sent message its provider message id names, inserts the events whose key is new, lists the
mailboxes they call for (`SuppressionRules`), and adds them to the hour's counts. It answers
with the events that were new, which are the only ones counted anywhere, so a service that
redelivers an event forty times moves nothing after the first. A database error propagates:
the receiver answers 5xx and the service retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from leasebox.db.queries import DEFAULT_SCHEMA, query_bytes
from leasebox.feedback.events import FeedbackEvent
from leasebox.store.suppressions import SuppressionRules

# How long a signed token is remembered: past a signature's window a replay is stale anyway.
TOKEN_SECONDS = 900.0


@dataclass(frozen=True)
class Stored:
    """An event stored by this request: linked to a message or not, and the reason it listed
    its mailbox with (None when it listed nothing)."""

    event: FeedbackEvent
    linked: bool
    listed: str | None


@dataclass(frozen=True)
class Recorded:
    """What a request amounted to: `fresh` False for a replayed token; the new events."""

    fresh: bool
    stored: list[Stored]
    received: int

    @property
    def duplicates(self) -> int:
        return self.received - len(self.stored) if self.fresh else 0


def _params(
    provider: str,
    events: list[FeedbackEvent],
    token: str | None,
    rules: SuppressionRules,
    now: datetime | None,
) -> dict[str, Any]:
    return {
        "provider": provider,
        "token": token,
        "token_seconds": TOKEN_SECONDS,
        "provider_message_ids": [e.provider_message_id for e in events],
        "recipient_keys": [e.recipient_key for e in events],
        "events": [e.type.value for e in events],
        "occurred_at": [e.occurred_at for e in events],
        "bounce_classes": [e.bounce_class for e in events],
        "smtp_statuses": [e.smtp_status for e in events],
        "details": [e.detail for e in events],
        "sending_domains": [e.sending_domain for e in events],
        "hard_bounce_seconds": rules.hard_bounce_seconds,
        "soft_bounce_limit": rules.soft_bounce_limit,
        "soft_bounce_window_seconds": rules.soft_bounce_window_seconds,
        "soft_bounce_seconds": rules.soft_bounce_seconds,
        "provider_seconds": rules.provider_seconds,
        "now": now,
    }


def _recorded(events: list[FeedbackEvent], rows: list[dict[str, Any]]) -> Recorded:
    by_key = {e.key: e for e in events}
    stored = [
        Stored(
            by_key[(r["provider_message_id"], r["recipient_key"], r["event"], r["occurred_at"])],
            bool(r["linked"]),
            r["listed"],
        )
        for r in rows
        if r["provider_message_id"] is not None
    ]
    return Recorded(bool(rows[0]["fresh"]) if rows else False, stored, len(events))


def record(
    conn: psycopg.Connection[Any],
    provider: str,
    events: list[FeedbackEvent],
    *,
    token: str | None = None,
    rules: SuppressionRules | None = None,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> Recorded:
    """Store `events` in the caller's transaction (the caller commits)."""
    params = _params(provider, events, token, rules or SuppressionRules(), now)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query_bytes("record_events", schema), params)
        return _recorded(events, cur.fetchall())


async def record_async(
    conn: psycopg.AsyncConnection[Any],
    provider: str,
    events: list[FeedbackEvent],
    *,
    token: str | None = None,
    rules: SuppressionRules | None = None,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> Recorded:
    """`record` on an async connection."""
    params = _params(provider, events, token, rules or SuppressionRules(), now)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query_bytes("record_events", schema), params)
        return _recorded(events, await cur.fetchall())
