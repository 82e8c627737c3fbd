"""Test doubles and helpers for the worker's tests (fixtures live in conftest.py).

The provider is a fake that records what it was asked to send and does, per recipient, what
the test scripted: accept, fail transiently or permanently, or hold the send until released.
The clock is what the worker passes to SQL as `now`, so leases, backoff and expiry move when
the test says so.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from leasebox.delivery.providers.base import (
    Email,
    SendResult,
)
from leasebox.errors import PermanentProviderError, TransientProviderError

Insert = Callable[..., int]
"""The `insert` fixture: insert one message with these fields, return its id."""


class ManualClock:
    """A clock the test moves; starts at the database's time when the test began."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class ScriptedProvider:
    """A provider whose behaviour per recipient is set by the test."""

    name = "scripted"

    def __init__(self) -> None:
        self.sent: list[Email] = []
        self.attempts: Counter[str] = Counter()
        self.transient_failures: dict[str, int] = {}
        self.rejected: set[str] = set()
        # Recipients the provider refuses with a permanent error of this code (`postmark_406`).
        self.refusals: dict[str, str] = {}
        self.holds: dict[str, asyncio.Event] = {}
        self.held: dict[str, asyncio.Event] = {}
        self.hold_all: asyncio.Event | None = None
        self.started_sends = 0
        self.problem: str | None = None
        self.message_id_prefix = "scripted"
        # A provider may say it reads no content (`null://` does): it then gets none.
        self.reads_content = True

    def hold(self, recipient: str) -> asyncio.Event:
        """Make sends to `recipient` wait until the returned event is set."""
        self.holds[recipient] = asyncio.Event()
        self.held[recipient] = asyncio.Event()
        return self.holds[recipient]

    async def start(self) -> None:
        return None

    async def send(self, email: Email) -> SendResult:
        self.started_sends += 1
        self.attempts[email.recipient] += 1
        if email.recipient in self.holds:
            self.held[email.recipient].set()
            await self.holds[email.recipient].wait()
        if self.hold_all is not None:
            await self.hold_all.wait()
        if email.recipient in self.rejected:
            raise PermanentProviderError("smtp_550", "550 mailbox unavailable")
        if email.recipient in self.refusals:
            code = self.refusals[email.recipient]
            raise PermanentProviderError(code, f"refused ({code})")
        remaining = self.transient_failures.get(email.recipient, 0)
        if remaining:
            self.transient_failures[email.recipient] = remaining - 1
            raise TransientProviderError("smtp_451", "451 try again later")
        self.sent.append(email)
        return SendResult(provider_message_id=f"{self.message_id_prefix}-{email.delivery_key}")

    async def check(self) -> str | None:
        return self.problem

    async def close(self) -> None:
        return None


def row_of(conn: psycopg.Connection, outbox_id: int) -> dict[str, Any]:
    """The message with where it is, as a dict (committed state); its lease token as text,
    as a claim hands it out."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT *, lease_token::text AS lease_token FROM leasebox.messages WHERE id = %s",
            (outbox_id,),
        )
        found = cur.fetchone()
    conn.rollback()
    assert found is not None
    return found


def statuses(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM leasebox.messages GROUP BY status").fetchall()
    conn.rollback()
    return {status: int(count) for status, count in rows}
