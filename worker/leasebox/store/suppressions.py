"""The suppression list: the mailboxes a scope must not mail, with why and until when.

An address that hard-bounced, complained, soft-bounced again and again, or that the provider
refuses as one it suppresses, costs the sender reputation every time it is mailed, and the
provider judges the account by those numbers. The list holds one entry per (scope, mailbox),
keyed by `leasebox.addresses.mailbox_key`; workers read it when they claim (a message to a
listed mailbox ends `suppressed`, unsent, see the `claim` statement), producers may read it
at `enqueue` (`RecipientSuppressed`), and provider events write it
(`leasebox.feedback.recording`). What a person does by hand is here: list, add (replacing an
entry), import many, remove; `lift` is the call an application makes once the user has
proven that the address works, so that one bounced reset mail never locks anyone out.

`now` is None in production (the database's clock); tests pass a datetime.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from leasebox.addresses import mailbox_key
from leasebox.config import FEEDBACK_PROVIDER_DAYS
from leasebox.db.queries import DEFAULT_SCHEMA, query
from leasebox.errors import ConfigurationError

DEFAULT_SCOPE = "default"
REASONS = ("complaint", "hard_bounce", "soft_bounces", "provider", "manual")
DAY = 86400.0


@dataclass(frozen=True)
class SuppressionRules:
    """How long each kind of trouble keeps a mailbox off the list's scope.

    A complaint is for good; a hard bounce for `hard_bounce_seconds`; `soft_bounce_limit`
    soft bounces within `soft_bounce_window_seconds` for `soft_bounce_seconds`; a provider's
    own refusal of a suppressed address for `provider_seconds`.
    """

    hard_bounce_seconds: float = 365 * DAY
    soft_bounce_limit: int = 3
    soft_bounce_window_seconds: float = 3 * DAY
    soft_bounce_seconds: float = 3 * DAY
    provider_seconds: float = FEEDBACK_PROVIDER_DAYS.default * DAY

    def __post_init__(self) -> None:
        if self.soft_bounce_limit < 1:
            raise ConfigurationError("the soft-bounce limit must be at least 1")
        for name in (
            "hard_bounce_seconds",
            "soft_bounce_window_seconds",
            "soft_bounce_seconds",
            "provider_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"the suppression rule {name} must be positive")


@dataclass(frozen=True)
class Suppression:
    """One entry: a mailbox a scope must not mail, why (`reason`, `detail`), since when and
    until when (`expires_at` None: until someone removes it)."""

    scope: str
    recipient_key: str
    reason: str
    detail: str | None
    event_id: int | None
    created_at: datetime
    expires_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["created_at"] = self.created_at.isoformat()
        data["expires_at"] = self.expires_at.isoformat() if self.expires_at else None
        return data


@dataclass(frozen=True)
class Entry:
    """An entry to add by hand: the address (any spelling of the mailbox) and its terms."""

    address: str
    scope: str = DEFAULT_SCOPE
    reason: str = "manual"
    detail: str | None = None
    expires_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ConfigurationError(
                f"unknown suppression reason {self.reason!r}: use one of {', '.join(REASONS)}"
            )
        if "@" not in self.address.strip()[1:-1]:
            raise ConfigurationError("not an email address (no @ between two parts)")
        if not self.scope:
            raise ConfigurationError("a suppression's scope cannot be empty")


def list_suppressions(
    conn: psycopg.Connection[Any],
    *,
    scope: str | None = None,
    address: str | None = None,
    reason: str | None = None,
    expired: bool = False,
    limit: int = 100,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> list[Suppression]:
    """Entries matching the selection, newest first; expired ones only when `expired`."""
    params = {
        "scope": scope,
        "recipient_key": mailbox_key(address) if address else None,
        "reason": reason,
        "expired": expired,
        "limit": limit,
        "now": now,
    }
    with conn.cursor(row_factory=class_row(Suppression)) as cur:
        cur.execute(query("list_suppressions", schema), params)
        return cur.fetchall()


def add_suppressions(
    conn: psycopg.Connection[Any],
    entries: Iterable[Entry],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> int:
    """Put each entry's mailbox on its scope's list, replacing what was there; commits.

    Returns how many entries were written (a mailbox given twice counts once: the last one
    wins)."""
    given: Sequence[Entry] = list(entries)
    if not given:
        return 0
    params = {
        "scopes": [e.scope for e in given],
        "recipient_keys": [mailbox_key(e.address) for e in given],
        "reasons": [e.reason for e in given],
        "details": [e.detail for e in given],
        "expires_at": [e.expires_at for e in given],
        "now": now,
    }
    with conn.transaction():
        row = conn.execute(query("add_suppressions", schema), params).fetchone()
    return int(row[0]) if row else 0


def remove_suppression(
    conn: psycopg.Connection[Any],
    address: str,
    *,
    scope: str = DEFAULT_SCOPE,
    schema: str = DEFAULT_SCHEMA,
) -> str | None:
    """Take the address's mailbox off the scope's list in the caller's transaction; returns
    the reason of the entry removed, or None when there was none."""
    params = {"scope": scope, "recipient_key": mailbox_key(address)}
    row = conn.execute(query("lift_suppression", schema), params).fetchone()
    return None if row is None else str(row[0])


async def remove_suppression_async(
    conn: psycopg.AsyncConnection[Any],
    address: str,
    *,
    scope: str = DEFAULT_SCOPE,
    schema: str = DEFAULT_SCHEMA,
) -> str | None:
    """`remove_suppression` on an async connection."""
    params = {"scope": scope, "recipient_key": mailbox_key(address)}
    cur = await conn.execute(query("lift_suppression", schema), params)
    row = await cur.fetchone()
    return None if row is None else str(row[0])
