"""Many logical sends in one statement: `enqueue_many`, with the semantics of `enqueue` each.

An application that signs up a thousand users, or a job that invites a team, would pay one
round trip and one statement per message through `enqueue`. `enqueue_many` sends the batch as
arrays to one `enqueue_many` statement (`unnest`), pipelined behind one statement that takes
the advisory locks of all its keys, so a batch of N costs one round trip whatever N is.

Each message behaves as it would through `enqueue`: a live receipt of the same request is
reused (and counted), a delivery key already in the outbox with the same message is the same
send, a new one is written with its receipt, and one with a replacement key supersedes the
pending messages of its key. Inside the batch, a key given twice for the same request is one
send (the later one gets the earlier one's receipt, `reused=True`), and so is an explicit
delivery key given twice for the same message; of two messages written with one replacement
key, the later supersedes the earlier (which is written, and never queued).

A conflict (a key reused for a different request, against the database or inside the batch)
writes nothing at all: `BatchConflict` lists every offending message, so the caller can drop
them and send the rest again. The abuse guard is not applied to batches (a batch is written
by the application itself, not by a form anyone can submit); `guard=` is refused with an
error rather than ignored.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from leasebox.catalogue import Catalogue, default_catalogue
from leasebox.db.queries import DEFAULT_SCHEMA, query_bytes, text_array
from leasebox.errors import (
    AlreadyExpired,
    BatchConflict,
    ConfigurationError,
    ConflictingRequest,
    DatabaseError,
)
from leasebox.messages import (
    DEFAULT_RECEIPT_TTL_SECONDS,
    STORED_JSON,
    OutboxMessage,
    Receipt,
    check_request_key,
)
from leasebox.producer.guard import AbuseGuard
from leasebox.producer.payload_crypto import PayloadCipher, default_cipher
from leasebox.producer.plan import carried_trace_context

__all__ = ["enqueue_many", "enqueue_many_async"]

_Statement = tuple[bytes, dict[str, Any]]


@dataclass(frozen=True)
class _Batch:
    """The statements of one batch and how to read their answer back in input order."""

    lock: _Statement | None
    write: _Statement
    # For each input message: its position among the rows sent to the statement (`ord` - 1),
    # and whether it repeats an earlier message's idempotency key (and is not sent itself).
    slots: tuple[tuple[int, bool], ...]
    keys: tuple[str | None, ...]
    scope: str | None
    scope_name: str


def _prepare(
    messages: Sequence[OutboxMessage],
    idempotency_keys: Sequence[str | None] | None,
    scope: str | None,
    request_hashes: Sequence[str | None] | None,
    guard: AbuseGuard | None,
    receipt_ttl_seconds: float,
    schema: str,
    cipher: PayloadCipher,
    catalogue: Catalogue | None = None,
) -> _Batch:
    if guard is not None:
        raise ConfigurationError(
            "enqueue_many does not apply an abuse guard; call enqueue(..., guard=...) per "
            "message for requests that need one"
        )
    if isinstance(messages, OutboxMessage) or not all(
        isinstance(m, OutboxMessage) for m in messages
    ):
        raise TypeError("enqueue_many takes a sequence of OutboxMessage")
    (default_catalogue() if catalogue is None else catalogue).check_all(messages)
    count = len(messages)
    keys = _per_message(idempotency_keys, count, "idempotency_keys")
    hashes = _per_message(request_hashes, count, "request_hashes")
    check_request_key("scope", scope, empty=True)
    for index, (key, given_hash) in enumerate(zip(keys, hashes, strict=True)):
        check_request_key(f"idempotency_key #{index}", key)
        check_request_key(f"request_hash #{index}", given_hash)
    scope_name = scope or "default"

    columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    slots: list[tuple[int, bool]] = []
    conflicts: list[ConflictingRequest] = []
    by_key: dict[str, tuple[int, str]] = {}  # idempotency key -> (slot, fingerprint)
    by_delivery_key: dict[str, str] = {}  # explicit delivery key -> message hash
    for index, message in enumerate(messages):
        key = keys[index]
        message_hash = message.request_hash()
        fingerprint = hashes[index] or message_hash
        if key is not None:
            earlier = by_key.get(key)
            if earlier is not None:
                if earlier[1] != fingerprint:
                    conflicts.append(ConflictingRequest(index, key, None, None))
                slots.append((earlier[0], True))
                continue
        explicit = message.delivery_key
        if explicit is not None:
            known = by_delivery_key.setdefault(explicit, message_hash)
            if known != message_hash:
                conflicts.append(ConflictingRequest(index, None, explicit, None))
        slot = len(columns["kinds"])
        if key is not None:
            by_key[key] = (slot, fingerprint)
        slots.append((slot, False))
        columns["kinds"].append(message.kind)
        columns["aggregate_ids"].append(message.aggregate_id)
        columns["recipients"].append(message.recipient)
        columns["recipient_keys"].append(message.recipient_key)
        columns["message_hashes"].append(message_hash)
        columns["templates"].append(message.template)
        columns["data"].append(message.data)
        columns["secrets"].append(cipher.seal(message.secrets) if message.secrets else None)
        columns["delivery_keys"].append(explicit or f"{message.kind}:{uuid.uuid4().hex}")
        columns["explicit_keys"].append(explicit is not None)
        columns["max_attempts"].append(message.max_attempts)
        columns["available_at"].append(message.available_at)
        columns["expires_at"].append(message.expires_at)
        columns["idempotency_keys"].append(key)
        columns["request_hashes"].append(fingerprint)
        columns["replacement_keys"].append(message.replacement_key)
    if conflicts:
        raise BatchConflict(scope_name, conflicts)

    receipt_keys = [f"leasebox.receipt\x1f{scope_name}\x1f{k}" for k in by_key]
    delivery_locks = [f"leasebox.delivery\x1f{k}" for k in by_delivery_key]
    replacement_locks = [
        f"leasebox.replacement\x1f{k}"
        for k in dict.fromkeys(columns["replacement_keys"])
        if k is not None
    ]
    lock = None
    if receipt_keys or delivery_locks or replacement_locks:
        lock = (
            query_bytes("lock_keys", schema),
            {
                "receipt_keys": text_array(receipt_keys),
                "delivery_keys": text_array(delivery_locks),
                "replacement_keys": text_array(replacement_locks),
            },
        )
    params: dict[str, Any] = {
        **columns,
        **{name: text_array(columns[name]) for name in _TEXT_COLUMNS},
        # One JSON array for the batch: packing 100 `Jsonb` values into a `jsonb[]` took
        # five times as long as encoding them together.
        "data": STORED_JSON.encode(columns["data"]),
        "scope": scope_name,
        "ttl_seconds": receipt_ttl_seconds,
        "trace_context": carried_trace_context(),
    }
    return _Batch(
        lock,
        (query_bytes("enqueue_many", schema), params),
        tuple(slots),
        tuple(keys),
        scope,
        scope_name,
    )


# The columns sent as `text[]` literals: cheaper to build than psycopg's element-by-element
# packing of a list (about a third of binding a batch of 100).
_TEXT_COLUMNS = (
    "kinds",
    "aggregate_ids",
    "recipients",
    "recipient_keys",
    "message_hashes",
    "templates",
    "delivery_keys",
    "idempotency_keys",
    "request_hashes",
    "replacement_keys",
)
# Every column; the others go in binary, and the data as one JSON array.
_COLUMNS = (
    *_TEXT_COLUMNS,
    "data",
    "secrets",
    "explicit_keys",
    "max_attempts",
    "available_at",
    "expires_at",
)


def _per_message(values: Sequence[str | None] | None, count: int, name: str) -> list[str | None]:
    if values is None:
        return [None] * count
    if isinstance(values, str) or len(values) != count:
        raise ValueError(f"{name} must be a sequence with one entry per message")
    if not all(v is None or (isinstance(v, str) and v) for v in values):
        raise ValueError(f"every entry of {name} must be a non-empty string or None")
    return list(values)


def _receipts(batch: _Batch, rows: list[tuple[Any, ...]]) -> list[Receipt]:
    """The receipts in input order, from the statement's rows (one per message sent to it).

    A row's `source` is `inserted` (this message wrote the send), `repeat` (an earlier message
    of the batch with the same delivery key did), `existing`, `receipt`, or a conflict.
    """
    written: dict[int, tuple[str, int, str]] = {}
    conflicts: list[ConflictingRequest] = []
    expired = sorted(
        index
        for ord_, source, _, _ in rows
        if source == "expired"
        for index, (slot, _) in enumerate(batch.slots)
        if slot == int(ord_) - 1
    )
    if expired:
        raise AlreadyExpired(expired)
    for ord_, source, outbox_id, delivery_key in rows:
        slot = int(ord_) - 1
        if source in ("conflict", "receipt_conflict"):
            index = next(i for i, (s, _) in enumerate(batch.slots) if s == slot)
            key = batch.keys[index] if source == "receipt_conflict" else None
            conflicts.append(
                ConflictingRequest(index, key, None if key else delivery_key, int(outbox_id))
            )
        written[slot] = (source, int(outbox_id), delivery_key)
    if conflicts:
        raise BatchConflict(batch.scope_name, sorted(conflicts, key=lambda c: c.index))
    receipts = []
    for index, (slot, repeated) in enumerate(batch.slots):
        source, outbox_id, delivery_key = written[slot]
        key = batch.keys[index]
        receipts.append(
            Receipt(
                outbox_id=outbox_id,
                delivery_key=delivery_key,
                reused=repeated or source != "inserted",
                scope=batch.scope_name if key is not None else batch.scope,
                idempotency_key=key,
            )
        )
    return receipts


@contextlib.contextmanager
def _keys_written_by_hand() -> Iterator[None]:
    """Turn a delivery key that another transaction wrote without leasebox's lock into a
    `DatabaseError` that says so.

    Under the batch's locks no other leasebox producer can write one of its delivery keys, so
    a row that breaks the delivery key's unique index was inserted by hand while the batch
    ran. A violation of any other index is passed on as it is.
    """
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        if "delivery_key" not in (exc.diag.constraint_name or ""):
            raise
        raise DatabaseError(
            "an outbox row with one of the batch's delivery keys was written concurrently "
            f"without leasebox's lock ({exc.diag.message_detail or exc}); nothing of the "
            "batch was written; roll back and retry the transaction"
        ) from exc


def enqueue_many(
    conn: psycopg.Connection[Any],
    messages: Sequence[OutboxMessage],
    *,
    idempotency_keys: Sequence[str | None] | None = None,
    scope: str | None = None,
    request_hashes: Sequence[str | None] | None = None,
    guard: AbuseGuard | None = None,
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS,
    schema: str = DEFAULT_SCHEMA,
    cipher: PayloadCipher | None = None,
    catalogue: Catalogue | None = None,
) -> list[Receipt]:
    """Write `messages` to the outbox in the caller's open transaction, in one statement.

    `idempotency_keys` (one per message, None for none) and `request_hashes` work as in
    `enqueue`; returns one `Receipt` per message, in input order. Raises `BatchConflict`,
    having written nothing, when any message reuses a key for a different request, and
    `InvalidMessage`, before any SQL, naming every message whose kind, template or required
    variable the `catalogue` (default: the process-wide one) does not know.
    """
    batch = _prepare(
        messages,
        idempotency_keys,
        scope,
        request_hashes,
        guard,
        receipt_ttl_seconds,
        schema,
        cipher or default_cipher(),
        catalogue,
    )
    if not batch.slots:
        return []
    return _receipts(batch, _written(conn, batch))


def _written(conn: psycopg.Connection[Any], batch: _Batch) -> list[tuple[Any, ...]]:
    """The batch's statements, run in one round trip; the write statement's rows."""
    with _keys_written_by_hand(), conn.cursor() as cur:
        if batch.lock is not None:
            # The locks are taken by the statement before the writer, so the writer's
            # snapshot sees whatever a previous holder of a lock committed.
            with conn.pipeline():
                conn.execute(*batch.lock, prepare=True)
                cur.execute(*batch.write, prepare=True)
        else:
            cur.execute(*batch.write, prepare=True)
        return cur.fetchall()


async def enqueue_many_async(
    conn: psycopg.AsyncConnection[Any],
    messages: Sequence[OutboxMessage],
    *,
    idempotency_keys: Sequence[str | None] | None = None,
    scope: str | None = None,
    request_hashes: Sequence[str | None] | None = None,
    guard: AbuseGuard | None = None,
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS,
    schema: str = DEFAULT_SCHEMA,
    cipher: PayloadCipher | None = None,
    catalogue: Catalogue | None = None,
) -> list[Receipt]:
    """`enqueue_many` for an async connection; the same semantics."""
    batch = _prepare(
        messages,
        idempotency_keys,
        scope,
        request_hashes,
        guard,
        receipt_ttl_seconds,
        schema,
        cipher or default_cipher(),
        catalogue,
    )
    if not batch.slots:
        return []
    return _receipts(batch, await _written_async(conn, batch))


async def _written_async(
    conn: psycopg.AsyncConnection[Any], batch: _Batch
) -> list[tuple[Any, ...]]:
    """`_written` on an async connection."""
    with _keys_written_by_hand():
        async with conn.cursor() as cur:
            if batch.lock is not None:
                async with conn.pipeline():
                    await conn.execute(*batch.lock, prepare=True)
                    await cur.execute(*batch.write, prepare=True)
            else:
                await cur.execute(*batch.write, prepare=True)
            return await cur.fetchall()
