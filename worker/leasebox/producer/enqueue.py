"""The producer API: write an outbox row in the caller's transaction, keyed by a receipt.

`enqueue` never commits: the row becomes visible exactly when the caller's business change
does, and disappears with it on rollback. A receipt keyed by `(scope, idempotency_key)`
turns a retried request into the same logical send. Concurrent requests with the same key
are serialised by a transaction-scoped advisory lock, so exactly one row is written.

The sync and async entry points share one step-by-step plan (`_plan`, run by
`leasebox.producer.plan`), so the logic exists once.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from leasebox.db.queries import DEFAULT_SCHEMA
from leasebox.errors import IdempotencyConflict
from leasebox.messages import OutboxMessage, Receipt
from leasebox.producer.guard import AbuseGuard, check_guard
from leasebox.producer.payload_crypto import PayloadCipher, default_cipher
from leasebox.producer.plan import Plan, Step, one, run, run_async

DEFAULT_RECEIPT_TTL_SECONDS = 24 * 3600.0


def _plan(
    message: OutboxMessage,
    idempotency_key: str | None,
    scope: str | None,
    request_hash: str | None,
    guard: AbuseGuard | None,
    receipt_ttl_seconds: float,
    cipher: PayloadCipher,
) -> Plan[Receipt]:
    scope_name = scope or "default"
    fingerprint = request_hash or message.request_hash()
    lock: list[tuple[str, dict[str, Any]]] = []
    if idempotency_key is not None:
        # Serialises requests with the same key; the statement after it sees the winner's row.
        lock = [("lock_key", {"key": f"leasebox.receipt\x1f{scope_name}\x1f{idempotency_key}"})]
    if guard is not None:
        if lock:
            yield Step(tuple(lock))
            lock = []
            found = yield one(
                "find_receipt", {"scope": scope_name, "idempotency_key": idempotency_key}
            )
            if found is not None and not found["expired"]:
                return _reused(found, fingerprint, scope_name, idempotency_key)
        yield from check_guard(guard, message.recipient.lower(), scope_name, idempotency_key)

    # The key is stored with the row, so every worker retry reuses it; a retried API request
    # reuses it through the receipt. It never contains the recipient or a secret.
    delivery_key = message.delivery_key or f"{message.kind}:{uuid.uuid4().hex}"
    write = {
        "kind": message.kind,
        "aggregate_id": message.aggregate_id,
        "recipient": message.recipient,
        "template": message.template,
        "data": Jsonb(message.data),
        "secrets": cipher.seal(message.secrets) if message.secrets else None,
        "delivery_key": delivery_key,
        "max_attempts": message.max_attempts,
        "available_at": message.available_at,
        "expires_at": message.expires_at,
        "scope": scope_name,
        "idempotency_key": idempotency_key,
        "request_hash": fingerprint,
        "ttl_seconds": receipt_ttl_seconds,
    }
    row = yield Step((*lock, ("enqueue", write)))
    assert row is not None, "the enqueue statement always returns one row"
    if row["source"] == "receipt":
        return _reused(row, fingerprint, scope_name, idempotency_key)
    return Receipt(
        outbox_id=int(row["outbox_id"]),
        delivery_key=row["delivery_key"],
        reused=row["source"] == "existing",
        scope=scope_name if idempotency_key is not None else scope,
        idempotency_key=idempotency_key,
    )


def _reused(
    found: dict[str, Any], fingerprint: str, scope: str, idempotency_key: str | None
) -> Receipt:
    """The receipt of a live earlier request with this key, or a conflict if it differs."""
    outbox_id = int(found["outbox_id"])
    if idempotency_key is None or found["request_hash"] != fingerprint:
        raise IdempotencyConflict(scope, idempotency_key or "", outbox_id)
    return Receipt(
        outbox_id=outbox_id,
        delivery_key=found["delivery_key"] or "",
        reused=True,
        scope=scope,
        idempotency_key=idempotency_key,
    )


def plan_enqueue(
    message: OutboxMessage,
    *,
    idempotency_key: str | None = None,
    scope: str | None = None,
    request_hash: str | None = None,
    guard: AbuseGuard | None = None,
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS,
    cipher: PayloadCipher | None = None,
) -> Plan[Receipt]:
    """The statements of one `enqueue`, for a runner over another driver (the ORM adapters).

    The plan is the whole of the producer's logic; a runner only executes its named
    statements in the caller's transaction (`leasebox.producer.portable`).
    """
    return _plan(
        message,
        idempotency_key,
        scope,
        request_hash,
        guard,
        receipt_ttl_seconds,
        cipher or default_cipher(),
    )


def enqueue(
    conn: psycopg.Connection[Any],
    message: OutboxMessage,
    *,
    idempotency_key: str | None = None,
    scope: str | None = None,
    request_hash: str | None = None,
    guard: AbuseGuard | None = None,
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS,
    schema: str = DEFAULT_SCHEMA,
    cipher: PayloadCipher | None = None,
) -> Receipt:
    """Write `message` to the outbox in the caller's open transaction; never commits.

    With an `idempotency_key`, the same `(scope, key)` returns the first outbox id with
    `reused=True`, and a different request under the same key raises `IdempotencyConflict`.
    `request_hash` overrides the default fingerprint (e.g. a hash of the HTTP body).
    """
    plan = _plan(
        message,
        idempotency_key,
        scope,
        request_hash,
        guard,
        receipt_ttl_seconds,
        cipher or default_cipher(),
    )
    return run(conn, plan, schema)


async def enqueue_async(
    conn: psycopg.AsyncConnection[Any],
    message: OutboxMessage,
    *,
    idempotency_key: str | None = None,
    scope: str | None = None,
    request_hash: str | None = None,
    guard: AbuseGuard | None = None,
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS,
    schema: str = DEFAULT_SCHEMA,
    cipher: PayloadCipher | None = None,
) -> Receipt:
    """`enqueue` for an async connection; the same semantics."""
    plan = _plan(
        message,
        idempotency_key,
        scope,
        request_hash,
        guard,
        receipt_ttl_seconds,
        cipher or default_cipher(),
    )
    return await run_async(conn, plan, schema)
