"""Reading one send's story back: its outbox row, its receipts and its attempt history.

When a login code arrives twice, the status code says little; what matters is whether the
API created one logical send or two, and whether one worker owned each attempt or several
raced it. The answers are in three tables: the outbox row (the logical send), the receipts
(which requests mapped onto it) and the history (one row per claim and per ending); and what
happened after the send in two more: the provider's events about it and the suppression-list
entry of its mailbox. This
module reads them, for a selector a person types, on the caller's connection and without
writing anything; `leasebox.inspection` turns what it reads into plain words.

Every lookup but one uses an index: the row by id, delivery key or receipt, then its
receipts (`receipts_outbox_idx`) and history (its primary key). `aggregate_id` has no index
(the hot paths never need one), so a lookup by aggregate scans the outbox; it is bounded by
a limit and meant for a person investigating, not for a program polling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from leasebox.db.queries import DEFAULT_SCHEMA, SqlFile, query
from leasebox.errors import NotMigrated

TRACE_SQL = SqlFile("leasebox.db", "trace.sql")
DEFAULT_SCOPE = "default"
DEFAULT_AGGREGATE_LIMIT = 20


@dataclass(frozen=True)
class Selector:
    """Which sends to trace: exactly one of an id, a delivery key, an idempotency key (in
    `scope`) or an aggregate id (optionally of one `kind`, at most `limit` rows)."""

    outbox_id: int | None = None
    delivery_key: str | None = None
    idempotency_key: str | None = None
    scope: str = DEFAULT_SCOPE
    aggregate_id: str | None = None
    kind: str | None = None
    limit: int = DEFAULT_AGGREGATE_LIMIT

    def __post_init__(self) -> None:
        given = [
            name
            for name in ("outbox_id", "delivery_key", "idempotency_key", "aggregate_id")
            if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "a selector needs exactly one of outbox_id, delivery_key, idempotency_key or "
                f"aggregate_id, got {len(given)}"
            )

    def describe(self) -> str:
        """The selector in words, e.g. ``idempotency key 'k1' in scope 'default'``."""
        if self.outbox_id is not None:
            return f"outbox id {self.outbox_id}"
        if self.delivery_key is not None:
            return f"delivery key {self.delivery_key!r}"
        if self.idempotency_key is not None:
            return f"idempotency key {self.idempotency_key!r} in scope {self.scope!r}"
        kind = f" of kind {self.kind!r}" if self.kind else ""
        return f"aggregate id {self.aggregate_id!r}{kind}"

    def as_dict(self) -> dict[str, Any]:
        if self.outbox_id is not None:
            return {"outbox_id": self.outbox_id}
        if self.delivery_key is not None:
            return {"delivery_key": self.delivery_key}
        if self.idempotency_key is not None:
            return {"idempotency_key": self.idempotency_key, "scope": self.scope}
        return {"aggregate_id": self.aggregate_id, "kind": self.kind, "limit": self.limit}


@dataclass(frozen=True)
class TracedRow:
    """An outbox row as a trace shows it: never its data, secrets or template."""

    id: int
    kind: str
    aggregate_id: str | None
    recipient: str
    delivery_key: str
    status: str
    attempts: int
    max_attempts: int | None
    created_at: datetime
    sent_at: datetime | None
    expires_at: datetime | None
    leased_by: str | None
    lease_token: UUID | None
    lease_expires_at: datetime | None
    dead_reason: str | None
    provider_message_id: str | None
    replacement_key: str | None = None
    superseded_by: int | None = None


@dataclass(frozen=True)
class ReceiptRecord:
    """A receipt: the first request with an idempotency key, and how many reused it."""

    outbox_id: int
    scope: str
    idempotency_key: str
    created_at: datetime
    last_seen_at: datetime | None
    reuse_count: int
    expires_at: datetime


@dataclass(frozen=True)
class HistoryEvent:
    """One row of the attempt history (see the `history` table in `schema.sql`)."""

    outbox_id: int
    id: int
    event: str
    at: datetime
    attempt: int | None
    lease_token: UUID | None
    worker_id: str | None
    lease_expires_at: datetime | None
    retry_delay_seconds: float | None
    error_class: str | None
    error: str | None
    dead_reason: str | None
    provider_message_id: str | None
    superseded_by: int | None = None


@dataclass(frozen=True)
class FeedbackRecord:
    """An event a mail service reported after it accepted the message (`events` table)."""

    outbox_id: int
    provider: str
    event: str
    bounce_class: str | None
    smtp_status: str | None
    detail: str | None
    occurred_at: datetime


@dataclass(frozen=True)
class SuppressionRecord:
    """The suppression-list entry in force for a message's mailbox in its scope."""

    outbox_id: int
    reason: str
    detail: str | None
    created_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True)
class TraceRecords:
    """What the database holds about the selected sends, newest send first for aggregates."""

    rows: tuple[TracedRow, ...]
    receipts: tuple[ReceiptRecord, ...]
    events: tuple[HistoryEvent, ...]
    feedback: tuple[FeedbackRecord, ...] = ()
    suppressions: tuple[SuppressionRecord, ...] = ()


def check_history(conn: psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA) -> None:
    """Raise `NotMigrated` unless `schema` has the history table (migration 0003)."""
    row = conn.execute(
        query("trace_history_exists", schema, TRACE_SQL), {"schema": schema}
    ).fetchone()
    if not row or not row[0]:
        raise NotMigrated(schema, "it has no attempt history table")


def find_rows(
    conn: psycopg.Connection[Any], selector: Selector, *, schema: str = DEFAULT_SCHEMA
) -> list[TracedRow]:
    """The outbox rows `selector` names (none, one, or up to its limit for an aggregate)."""
    params: dict[str, Any]
    if selector.outbox_id is not None:
        name, params = "trace_by_id", {"outbox_id": selector.outbox_id}
    elif selector.delivery_key is not None:
        name, params = "trace_by_delivery_key", {"delivery_key": selector.delivery_key}
    elif selector.idempotency_key is not None:
        name = "trace_by_idempotency_key"
        params = {"idempotency_key": selector.idempotency_key, "scope": selector.scope}
    else:
        name = "trace_by_aggregate"
        params = {
            "aggregate_id": selector.aggregate_id,
            "kind": selector.kind,
            "limit": selector.limit,
        }
    with conn.cursor(row_factory=class_row(TracedRow)) as cur:
        return cur.execute(query(name, schema, TRACE_SQL), params).fetchall()


def fetch_receipts(
    conn: psycopg.Connection[Any], outbox_ids: Sequence[int], *, schema: str = DEFAULT_SCHEMA
) -> list[ReceiptRecord]:
    """The receipts that map onto `outbox_ids`, first request first."""
    with conn.cursor(row_factory=class_row(ReceiptRecord)) as cur:
        statement = query("trace_receipts", schema, TRACE_SQL)
        return cur.execute(statement, {"outbox_ids": list(outbox_ids)}).fetchall()


def fetch_history(
    conn: psycopg.Connection[Any], outbox_ids: Sequence[int], *, schema: str = DEFAULT_SCHEMA
) -> list[HistoryEvent]:
    """The history of `outbox_ids`, per row in the order it was written."""
    with conn.cursor(row_factory=class_row(HistoryEvent)) as cur:
        statement = query("trace_history", schema, TRACE_SQL)
        return cur.execute(statement, {"outbox_ids": list(outbox_ids)}).fetchall()


def read_trace(
    conn: psycopg.Connection[Any], selector: Selector, *, schema: str = DEFAULT_SCHEMA
) -> TraceRecords:
    """The rows `selector` names with their receipts and history (empty when none match)."""
    rows = find_rows(conn, selector, schema=schema)
    ids = [row.id for row in rows]
    if not ids:
        return TraceRecords((), (), ())
    receipts = fetch_receipts(conn, ids, schema=schema)
    events = fetch_history(conn, ids, schema=schema)
    params = {"outbox_ids": ids}
    with conn.cursor(row_factory=class_row(FeedbackRecord)) as cur:
        feedback = cur.execute(query("trace_feedback", schema, TRACE_SQL), params).fetchall()
    with conn.cursor(row_factory=class_row(SuppressionRecord)) as cur:
        statement = query("trace_suppressions", schema, TRACE_SQL)
        suppressions = cur.execute(statement, params).fetchall()
    return TraceRecords(
        tuple(rows), tuple(receipts), tuple(events), tuple(feedback), tuple(suppressions)
    )


async def read_traces_async(
    conn: psycopg.AsyncConnection[Any], outbox_ids: Sequence[int], *, schema: str = DEFAULT_SCHEMA
) -> TraceRecords:
    """The rows with `outbox_ids` (in id order) with their receipts and history, on an
    async connection: what `leasebox demo` reads to explain its duplicates."""
    params = {"outbox_ids": list(outbox_ids)}
    if not params["outbox_ids"]:
        return TraceRecords((), (), ())
    async with conn.cursor(row_factory=class_row(TracedRow)) as cur:
        await cur.execute(query("trace_by_ids", schema, TRACE_SQL), params)
        rows = await cur.fetchall()
    async with conn.cursor(row_factory=class_row(ReceiptRecord)) as cur:
        await cur.execute(query("trace_receipts", schema, TRACE_SQL), params)
        receipts = await cur.fetchall()
    async with conn.cursor(row_factory=class_row(HistoryEvent)) as cur:
        await cur.execute(query("trace_history", schema, TRACE_SQL), params)
        events = await cur.fetchall()
    async with conn.cursor(row_factory=class_row(FeedbackRecord)) as cur:
        await cur.execute(query("trace_feedback", schema, TRACE_SQL), params)
        feedback = await cur.fetchall()
    async with conn.cursor(row_factory=class_row(SuppressionRecord)) as cur:
        await cur.execute(query("trace_suppressions", schema, TRACE_SQL), params)
        suppressions = await cur.fetchall()
    return TraceRecords(
        tuple(rows), tuple(receipts), tuple(events), tuple(feedback), tuple(suppressions)
    )
