"""The producer API: write an outbox row in the caller's transaction, keyed by a receipt.

`enqueue` never commits: the row becomes visible exactly when the caller's business change
does, and disappears with it on rollback. A receipt keyed by `(scope, idempotency_key)`
turns a retried request into the same logical send. Concurrent requests with the same key
are serialised by a transaction-scoped advisory lock, so exactly one row is written.

The sync and async entry points share one step-by-step plan (`_plan`): a generator that
yields statements and receives their first row, so the logic exists once.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from leasebox.db.queries import DEFAULT_SCHEMA, query
from leasebox.errors import IdempotencyConflict, RateLimited
from leasebox.messages import OutboxMessage, Receipt
from leasebox.producer.payload_crypto import PayloadCipher, default_cipher

DEFAULT_RECEIPT_TTL_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class AbuseGuard:
    """Optional limits on logical sends (against OTP bombing); reused receipts never count.

    A limit of None is off. Windows are sliding: the oldest send in the window decides
    the retry-after.
    """

    per_recipient: int | None = None
    per_scope: int | None = None
    window_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("per_recipient", "per_scope"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 or None")
        if self.window_seconds <= 0:
            raise ValueError("window_seconds must be positive")


@dataclass(frozen=True)
class _Step:
    """Statements sent together (pipelined); the plan receives the last one's first row."""

    queries: tuple[tuple[str, dict[str, Any]], ...]


_Row = tuple[Any, ...] | None
_Plan = Generator[_Step, _Row, Receipt]


def _one(name: str, params: dict[str, Any]) -> _Step:
    return _Step(((name, params),))


def _plan(
    message: OutboxMessage,
    idempotency_key: str | None,
    scope: str | None,
    request_hash: str | None,
    guard: AbuseGuard | None,
    receipt_ttl_seconds: float,
    cipher: PayloadCipher,
) -> _Plan:
    scope_name = scope or "default"
    fingerprint = request_hash or message.request_hash()
    lock: list[tuple[str, dict[str, Any]]] = []
    if idempotency_key is not None:
        # Serialises requests with the same key; the statement after it sees the winner's row.
        lock = [("lock_key", {"key": f"leasebox.receipt\x1f{scope_name}\x1f{idempotency_key}"})]
    if guard is not None:
        if lock:
            yield _Step(tuple(lock))
            lock = []
            found = yield _one(
                "find_receipt", {"scope": scope_name, "idempotency_key": idempotency_key}
            )
            if found is not None and not found[2]:
                return _reused(found[1], found[3], found[0], fingerprint, scope_name,
                               idempotency_key)  # fmt: skip
        yield from _check_guard(guard, message.recipient.lower(), scope_name, idempotency_key)

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
    row = yield _Step((*lock, ("enqueue", write)))
    assert row is not None, "the enqueue statement always returns one row"
    source, outbox_id, stored_key, stored_hash = row
    if source == "receipt":
        return _reused(outbox_id, stored_key, stored_hash, fingerprint, scope_name,
                       idempotency_key)  # fmt: skip
    return Receipt(
        outbox_id=int(outbox_id),
        delivery_key=stored_key,
        reused=source == "existing",
        scope=scope_name if idempotency_key is not None else scope,
        idempotency_key=idempotency_key,
    )


def _reused(
    outbox_id: int,
    delivery_key: str | None,
    stored_hash: str,
    fingerprint: str,
    scope: str,
    idempotency_key: str | None,
) -> Receipt:
    """The receipt of a live earlier request with this key, or a conflict if it differs."""
    assert idempotency_key is not None
    if stored_hash != fingerprint:
        raise IdempotencyConflict(scope, idempotency_key, outbox_id)
    return Receipt(
        outbox_id=outbox_id,
        delivery_key=delivery_key or "",
        reused=True,
        scope=scope,
        idempotency_key=idempotency_key,
    )


def _check_guard(
    guard: AbuseGuard, recipient: str, scope: str, idempotency_key: str | None
) -> Generator[_Step, _Row, None]:
    checks: list[tuple[str, int, str, dict[str, Any]]] = []
    if guard.per_recipient is not None:
        checks.append(
            (
                "per-recipient",
                guard.per_recipient,
                "count_recipient_window",
                {"recipient": recipient},
            )
        )
    if guard.per_scope is not None and idempotency_key is not None:
        checks.append(("per-scope", guard.per_scope, "count_scope_window", {"scope": scope}))
    for label, limit, query_name, params in checks:
        lock_subject = next(iter(params.values()))
        yield _one("lock_key", {"key": f"leasebox.guard\x1f{label}\x1f{lock_subject}"})
        row = yield _one(query_name, {**params, "window_seconds": guard.window_seconds})
        assert row is not None
        count, oldest, now = row
        if count >= limit:
            retry_after = guard.window_seconds - (now - oldest).total_seconds()
            raise RateLimited(label, limit, guard.window_seconds, max(retry_after, 0.0))


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
    try:
        step = next(plan)
        while True:
            *before, (name, params) = step.queries
            with ExitStack() as stack:
                if before:
                    stack.enter_context(conn.pipeline())
                    for earlier, earlier_params in before:
                        conn.execute(query(earlier, schema), earlier_params, prepare=True)
                cur = stack.enter_context(conn.cursor())
                cur.execute(query(name, schema), params, prepare=True)
                row = cur.fetchone()
            step = plan.send(row)
    except StopIteration as done:
        result: Receipt = done.value
        return result


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
    try:
        step = next(plan)
        while True:
            *before, (name, params) = step.queries
            async with AsyncExitStack() as stack:
                if before:
                    await stack.enter_async_context(conn.pipeline())
                    for earlier, earlier_params in before:
                        await conn.execute(query(earlier, schema), earlier_params, prepare=True)
                cur = await stack.enter_async_context(conn.cursor())
                await cur.execute(query(name, schema), params, prepare=True)
                row = await cur.fetchone()
            step = plan.send(row)
    except StopIteration as done:
        result: Receipt = done.value
        return result
