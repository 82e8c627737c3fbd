"""Claiming rows under a lease, and keeping the lease while a send runs.

A claim is one statement on an autocommit connection: it picks ready rows of the worker's
kinds from the queue (`FOR UPDATE SKIP LOCKED`, oldest availability first, or the kinds of a
higher priority first, with a share for rows past their kind's SLA), marks them
`processing` with a fresh lease token and counts the attempt, and commits before the caller
sends anything, so no lock outlives the statement. The token is what every later statement
about the row must match (`settling`), so a worker that lost its lease can no longer touch
the row. A row whose mailbox its scope must not mail (the suppression list) is not leased:
the same statement settles it `suppressed`. The statement also writes each claim to the
attempt history (`claimed`: the attempt, the token, the worker, when the lease runs out), at
no extra round trip, and reads each message's content from the outbox, unless the caller's
provider reads none (`content=False`: recipient, template, data, secrets and the enqueuing
request's trace context then come back empty).

`now` is None in production (the database's clock, shared by all workers); tests pass a
datetime to move time without sleeping.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from leasebox.db.queries import DEFAULT_SCHEMA, query_bytes, text_array

Connection = psycopg.AsyncConnection[Any]
# The aging of a kind that has none: a hundred years, longer than any message waits.
NEVER_AGED = 100 * 365 * 86400.0


class ClaimedMessage(NamedTuple):
    """One message as claimed: what to send, and the lease that allows settling it.

    A named tuple, built straight from the claim's row (a worker makes one per message, so
    its construction is on the hot path); its repr leaves out the recipient and the content.
    The content (recipient, template, data) is None when the claim did not read it, and
    when the message's outbox row is missing.
    """

    id: int
    kind: str
    aggregate_id: str | None
    recipient: str | None
    template: str | None
    data: Mapping[str, Any] | None
    secrets: bytes | None
    delivery_key: str
    attempts: int
    max_attempts: int | None
    expires_at: datetime | None
    # The lease token as text: the worker only compares it and sends it back.
    lease_token: str
    lease_expires_at: datetime
    created_at: datetime
    claimed_at: datetime
    # Where the row stood in the ready index: a worker's cursor for its next claim.
    available_at: datetime
    # Messages of one replacement key replace one another (None: nothing replaces this one).
    replacement_key: str | None = None
    # The enqueuing request's trace context (a W3C carrier), read with the content only.
    trace_context: Mapping[str, Any] | None = None
    # Set on a row the claim found suppressed (the entry's reason): it holds no lease and has
    # left the queue; the claim's `suppressed` list carries these.
    suppression: str | None = None

    @property
    def lease(self) -> LeaseRef:
        return LeaseRef(self.id, self.lease_token)

    def __repr__(self) -> str:
        return (
            f"ClaimedMessage(id={self.id!r}, kind={self.kind!r}, "
            f"aggregate_id={self.aggregate_id!r}, template={self.template!r}, "
            f"delivery_key={self.delivery_key!r}, attempts={self.attempts!r}, "
            f"max_attempts={self.max_attempts!r}, expires_at={self.expires_at!r}, "
            f"lease_token={self.lease_token!r}, lease_expires_at={self.lease_expires_at!r}, "
            f"created_at={self.created_at!r}, claimed_at={self.claimed_at!r}, "
            f"available_at={self.available_at!r}, replacement_key={self.replacement_key!r}, "
            f"suppression={self.suppression!r})"
        )


# The claim's column names as the result reports them (bytes), to check a result cheaply.
_FIELD_NAMES = tuple(name.encode() for name in ClaimedMessage._fields)


def _claimed_rows(cursor: Any) -> Callable[[Sequence[Any]], ClaimedMessage]:
    """Rows of the claim as `ClaimedMessage`s: positionally when the columns are the fields in
    order (checked once per statement, on the result's own names: `description` would build
    a column object per column), else by name."""
    result = cursor.pgresult
    found = () if result is None else tuple(result.fname(i) for i in range(result.nfields))
    if found == _FIELD_NAMES:
        return ClaimedMessage._make
    names = tuple(column.name for column in cursor.description or ())
    return lambda values: ClaimedMessage(**dict(zip(names, values, strict=True)))


class Claimed(list[ClaimedMessage]):
    """The rows a claim leased, in the order they were chosen; `suppressed` are the rows it
    chose and found suppressed instead (settled already, no lease, their `suppression` set)."""

    suppressed: list[ClaimedMessage]

    def __init__(self, rows: list[ClaimedMessage]) -> None:
        # The suppressed rows come last (the statement sorts them there): most claims have
        # none, which the last row tells at once.
        split = len(rows)
        while split and rows[split - 1].suppression is not None:
            split -= 1
        super().__init__(rows[:split] if split < len(rows) else rows)
        self.suppressed = rows[split:]

    @property
    def chosen(self) -> int:
        """How many ready rows the claim took, leased or suppressed."""
        return len(self) + len(self.suppressed)


class Cursor(NamedTuple):
    """A place in a kind's ready rows: the (available_at, id) of the last row claimed."""

    available_at: datetime
    id: int


class LeaseRef(NamedTuple):
    """A row and the lease token its settling statement must match.

    A claim hands the token out as text (a `uuid.UUID` is accepted too): the worker only ever
    compares it and sends it back, and text costs a tenth of a `UUID` to load and to send.
    """

    id: int
    token: uuid.UUID | str


def lease_keys(leases: Iterable[LeaseRef]) -> dict[str, str]:
    """The `ids` and `tokens` of a batch's statement, as array literals (`{1,2}`).

    psycopg packs each element of a list parameter in Python, which for a worker settling
    tens of thousands of rows a second costs more than the statement; ids and tokens need no
    quoting, so `join` writes them at C speed, and the statement casts them (`::bigint[]`).
    """
    ids, tokens = zip(*leases, strict=True)
    return {
        "ids": "{" + ",".join(map(str, ids)) + "}",
        "tokens": "{" + ",".join(map(str, tokens)) + "}",
    }


def _literal(values: Iterable[object]) -> str:
    """An array literal of numbers or timestamps (None is NULL), each in its text form."""
    return text_array(None if value is None else str(value) for value in values)


async def claim(
    conn: Connection,
    *,
    kinds: Sequence[str],
    limit: int,
    lease_seconds: float,
    worker_id: str,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
    content: bool = True,
    after: Mapping[str, Cursor] | None = None,
    priorities: Mapping[str, int] | None = None,
    aging: Mapping[str, float] | None = None,
    aged_limit: int = 0,
) -> Claimed:
    """Lease up to `limit` ready rows of `kinds`, oldest availability first, with their
    content unless `content` is False; a kind in `after` is read from past its cursor on.

    Kinds of a higher `priorities` value (0 when not given) are taken first, except that up
    to `aged_limit` rows that have waited, since their creation, longer than their kind's
    `aging` seconds go before them all (the caller gives that share to keep lower priorities
    from starving). The rows come back in the order of the ready index, whatever was chosen.
    A row whose mailbox is on its scope's suppression list is settled `suppressed` instead
    and returned in `suppressed`.
    """
    if limit <= 0:
        return Claimed([])
    cursors = [(after or {}).get(kind) for kind in kinds]
    # The per-kind arrays go as literals, which the statement casts: psycopg's packing of
    # five small lists cost a claim 30 µs, more than the rest of binding it.
    params = {
        "kinds": text_array(kinds),
        "after_at": _literal(c.available_at if c else None for c in cursors),
        "after_id": _literal(c.id if c else None for c in cursors),
        "priorities": _literal((priorities or {}).get(kind, 0) for kind in kinds),
        "aging": _literal((aging or {}).get(kind, NEVER_AGED) for kind in kinds),
        "aged_limit": aged_limit,
        "limit": limit,
        "lease_seconds": lease_seconds,
        "worker_id": worker_id,
        "now": now,
    }
    # In the binary format: each row's timestamps and numbers load without parsing text.
    statement = query_bytes("claim" if content else "claim_without_content", schema)
    async with conn.cursor(row_factory=_claimed_rows, binary=True) as cur:
        # Prepared at its first run on a connection, not its sixth (psycopg's default): run
        # unprepared, the claim is parsed and planned every time, 2 to 3 ms more than its
        # prepared run, and each connection a draining worker opens paid that five times.
        await cur.execute(statement, params, prepare=True)
        return Claimed(await cur.fetchall())


async def extend_leases(
    conn: Connection,
    leases: Sequence[LeaseRef],
    *,
    lease_seconds: float,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> dict[int, datetime]:
    """Push the leases' expiry to now + `lease_seconds`; returns id -> new expiry if owned."""
    if not leases:
        return {}
    params = {**lease_keys(leases), "lease_seconds": lease_seconds, "now": now}
    async with conn.cursor() as cur:
        await cur.execute(query_bytes("extend_leases", schema), params)
        return {int(outbox_id): expiry async for outbox_id, expiry in cur}


async def newer_replacement(
    conn: Connection, message: ClaimedMessage, *, schema: str = DEFAULT_SCHEMA
) -> int | None:
    """The id of the newest committed message of `message`'s replacement key newer than it,
    or None: asked right before the message is written to the wire (one index probe per day
    partition since the message's own)."""
    if message.replacement_key is None:
        return None
    params = {
        "replacement_key": message.replacement_key,
        "id": message.id,
        "created_at": message.created_at,
    }
    async with conn.cursor() as cur:
        await cur.execute(query_bytes("newer_replacement", schema), params)
        row = await cur.fetchone()
    return None if row is None else int(row[0])
