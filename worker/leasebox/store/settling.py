"""Settling claimed rows while the lease holds: sent, retry later, dead, suppressed, released
unsent, or superseded by a newer message of their replacement key.

Each statement takes many rows at once (the runtime batches outcomes) and matches each queue
row on its lease token and `status = 'processing'`. It returns the ids that matched; an id
missing from the answer is a lease the caller no longer owns (it stalled past the lease and
another worker reclaimed the row), which the caller counts as lost and never retries. A
sent message leaves the queue: its `sent` history row is the record of the send, and so does
a superseded one, with its `superseded` row.

The same statement writes the attempt history: one row per settled row (`sent`, `retry` or
`ambiguous`, `dead`, `suppressed`, `released`, `superseded`), and a `lease_lost` row, in the
name of `worker_id`, for each row whose lease the caller no longer held, with what it learnt
(the provider's id of a second copy the provider took, or the error). No extra round trip.

`now` is None in production (the database's clock); tests pass a datetime.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from leasebox.db.queries import DEFAULT_SCHEMA, query_bytes, text_array
from leasebox.states import DeadReason
from leasebox.store.claiming import Connection, LeaseRef, lease_keys


class Sent(NamedTuple):
    """The provider accepted the message."""

    lease: LeaseRef
    provider_message_id: str | None


class Retry(NamedTuple):
    """A transient failure: pending again after `delay_seconds`."""

    lease: LeaseRef
    delay_seconds: float
    error: str
    error_class: str


class Dead(NamedTuple):
    """A permanent failure, no attempts left, or expired: a dead letter with a reason."""

    lease: LeaseRef
    reason: DeadReason
    error: str
    error_class: str | None


class Suppressed(NamedTuple):
    """The provider refused the address as one it suppresses: not sent, for good, and the
    mailbox goes on its scope's suppression list for `expiry_seconds`."""

    lease: LeaseRef
    error: str
    error_class: str
    expiry_seconds: float


class Release(NamedTuple):
    """Not sent (shutdown, or the lease ran out before the send began): ready again at once,
    with the claim's attempt given back."""

    lease: LeaseRef


class Superseded(NamedTuple):
    """Not sent, and never to be: message `newer` of its replacement key replaced it before
    it reached the wire."""

    lease: LeaseRef
    newer: int


Settlement = Sent | Retry | Dead | Suppressed | Release | Superseded


async def mark_sent(
    conn: Connection,
    items: Sequence[Sent],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
    worker_id: str | None = None,
) -> dict[int, float]:
    """Mark rows sent; returns id -> seconds from creation to sent for the rows still owned."""
    if not items:
        return {}
    params = {
        **lease_keys(item.lease for item in items),
        "provider_message_ids": text_array(item.provider_message_id for item in items),
        "now": now,
        "worker_id": worker_id,
    }
    async with conn.cursor() as cur:
        # Prepared at its first run, as the claim is (`claiming.claim`).
        await cur.execute(query_bytes("mark_sent", schema), params, prepare=True)
        rows = await cur.fetchall()
    return dict(rows)


async def schedule_retry(
    conn: Connection,
    items: Sequence[Retry],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
    worker_id: str | None = None,
) -> set[int]:
    """Return rows to `pending`, ready again after their delay; returns the ids still owned."""
    if not items:
        return set()
    params = {
        **lease_keys(item.lease for item in items),
        "delays": [item.delay_seconds for item in items],
        "errors": [item.error for item in items],
        "error_classes": [item.error_class for item in items],
        "now": now,
        "worker_id": worker_id,
    }
    return await _ids(conn, "schedule_retry", schema, params)


async def mark_dead(
    conn: Connection,
    items: Sequence[Dead],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
    worker_id: str | None = None,
) -> set[int]:
    """Dead-letter rows with a reason; returns the ids still owned."""
    if not items:
        return set()
    params = {
        **lease_keys(item.lease for item in items),
        "reasons": [str(item.reason) for item in items],
        "errors": [item.error for item in items],
        "error_classes": [item.error_class for item in items],
        "now": now,
        "worker_id": worker_id,
    }
    return await _ids(conn, "mark_dead", schema, params)


async def mark_suppressed(
    conn: Connection,
    items: Sequence[Suppressed],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
    worker_id: str | None = None,
) -> set[int]:
    """Settle rows as suppressed and list their mailboxes; returns the ids still owned."""
    if not items:
        return set()
    params = {
        **lease_keys(item.lease for item in items),
        "errors": [item.error for item in items],
        "error_classes": [item.error_class for item in items],
        # One statement, one expiry: the longest asked for (they all come from one setting).
        "expiry_seconds": max(item.expiry_seconds for item in items),
        "now": now,
        "worker_id": worker_id,
    }
    return await _ids(conn, "mark_suppressed", schema, params)


async def release_leases(
    conn: Connection,
    leases: Sequence[LeaseRef],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
    worker_id: str | None = None,
) -> set[int]:
    """Give rows back unsent, ready at once, with the claim's attempt undone."""
    if not leases:
        return set()
    params = {
        **lease_keys(leases),
        "now": now,
        "worker_id": worker_id,
    }
    return await _ids(conn, "release_leases", schema, params)


async def mark_superseded(
    conn: Connection,
    items: Sequence[Superseded],
    *,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
    worker_id: str | None = None,
) -> set[int]:
    """Take superseded rows out of the queue, naming their newer message; returns the ids
    still owned."""
    if not items:
        return set()
    params = {
        **lease_keys(item.lease for item in items),
        "newer": [item.newer for item in items],
        "now": now,
        "worker_id": worker_id,
    }
    return await _ids(conn, "mark_superseded", schema, params)


async def _ids(conn: Connection, name: str, schema: str, params: dict[str, Any]) -> set[int]:
    async with conn.cursor() as cur:
        await cur.execute(query_bytes(name, schema), params)
        rows = await cur.fetchall()
    return {int(outbox_id) for (outbox_id,) in rows}
