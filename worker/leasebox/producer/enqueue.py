"""The producer API: write an outbox row in the caller's transaction, keyed by a receipt.

`enqueue` never commits: the row becomes visible exactly when the caller's business change
does, and disappears with it on rollback. On a connection in autocommit mode (a request with
no business change) each send is a transaction of its own (`leasebox.producer.plan`).
A receipt keyed by `(scope, idempotency_key)` turns a retried request into the same logical
send, and so does an explicit delivery key already in the outbox, as long as it sends the
same message (another message under the same key is an `IdempotencyConflict`, never a
silent merge). Concurrent requests with the same idempotency key or delivery key are
serialised by transaction-scoped advisory locks, so exactly one row is written and every
racer gets a receipt for it.

The sync and async entry points share one step-by-step plan (`_plan`, run by
`leasebox.producer.plan`), so the logic exists once.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from leasebox.catalogue import Catalogue, default_catalogue
from leasebox.db.queries import DEFAULT_SCHEMA
from leasebox.errors import (
    AlreadyExpired,
    DatabaseError,
    IdempotencyConflict,
    RecipientSuppressed,
)
from leasebox.messages import (
    DEFAULT_RECEIPT_TTL_SECONDS,
    OutboxMessage,
    Receipt,
    check_request_key,
)
from leasebox.producer.guard import AbuseGuard, check_guard
from leasebox.producer.payload_crypto import PayloadCipher, default_cipher
from leasebox.producer.plan import Plan, Step, carried_trace_context, one, run, run_async
from leasebox.producer.recipients import RecipientPolicy

__all__ = ["DEFAULT_RECEIPT_TTL_SECONDS", "enqueue", "enqueue_async"]


def _plan(
    message: OutboxMessage,
    idempotency_key: str | None,
    scope: str | None,
    request_hash: str | None,
    guard: AbuseGuard | None,
    receipt_ttl_seconds: float,
    cipher: PayloadCipher,
    catalogue: Catalogue | None,
    check_suppression: bool = False,
) -> Plan[Receipt]:
    # Before any statement: a key the database would refuse would abort the caller's whole
    # transaction from inside it.
    check_request_key("idempotency_key", idempotency_key)
    check_request_key("scope", scope, empty=True)
    check_request_key("request_hash", request_hash)
    # Before any statement: a message no worker could send is refused while the caller
    # still holds the request, not dead-lettered later.
    (default_catalogue() if catalogue is None else catalogue).check(message)
    scope_name = scope or "default"
    message_hash = message.request_hash()
    fingerprint = request_hash or message_hash
    explicit_key = message.delivery_key
    # Serialise requests with the same idempotency key, then with the same delivery key, then
    # with the same replacement key (in this order, before the guard's locks, so that no two
    # producers wait in a cycle): a statement that runs after a lock sees the row its holder
    # committed, so of two messages of one replacement key the later supersedes the earlier.
    keys: list[str] = []
    if idempotency_key is not None:
        keys.append(f"leasebox.receipt\x1f{scope_name}\x1f{idempotency_key}")
    if explicit_key is not None:
        keys.append(f"leasebox.delivery\x1f{explicit_key}")
    if message.replacement_key is not None:
        keys.append(f"leasebox.replacement\x1f{message.replacement_key}")
    locks = [("lock_key", {"key": key}) for key in keys]
    if guard is not None:
        # A request that reuses its receipt or its row is no new send and never counts.
        reuses_row = False
        if idempotency_key is not None:
            found = yield Step(
                (
                    *locks,
                    (
                        "find_receipt",
                        {
                            "scope": scope_name,
                            "idempotency_key": idempotency_key,
                            "request_hash": fingerprint,
                        },
                    ),
                )
            )
            locks = []
            if found is not None:
                return _reused(found, fingerprint, scope_name, idempotency_key)
        if explicit_key is not None:
            row = yield Step(
                (
                    *locks,
                    (
                        "find_delivery_key",
                        {"delivery_key": explicit_key, "message_hash": message_hash},
                    ),
                )
            )
            locks = []
            if row is not None and not row["same"]:
                raise _delivery_key_conflict(row, scope_name, idempotency_key)
            reuses_row = row is not None
        if locks:
            yield Step(tuple(locks))
            locks = []
        if not reuses_row:
            yield from check_guard(guard, message.recipient_key, scope_name)

    if check_suppression:
        # Under the key's lock (taken with it, in one round trip): a listed mailbox is refused
        # before anything is written, and a retried request of it is refused too.
        found = yield Step(
            (
                *locks,
                (
                    "find_suppression",
                    {"scope": scope_name, "recipient_key": message.recipient_key, "now": None},
                ),
            )
        )
        locks = []
        if found is not None:
            raise RecipientSuppressed(found["reason"], found["expires_at"])

    # The key is stored with the row, so every worker retry reuses it; a retried API request
    # reuses it through the receipt. It never contains the recipient or a secret.
    delivery_key = explicit_key or f"{message.kind}:{uuid.uuid4().hex}"
    write = {
        "kind": message.kind,
        "aggregate_id": message.aggregate_id,
        "recipient": message.recipient,
        "recipient_key": message.recipient_key,
        "scope": scope_name,
        "message_hash": message_hash,
        "template": message.template,
        "data": Jsonb(message.data),
        "secrets": cipher.seal(message.secrets) if message.secrets else None,
        "delivery_key": delivery_key,
        "explicit_key": explicit_key is not None,
        "max_attempts": message.max_attempts,
        "available_at": message.available_at,
        "expires_at": message.expires_at,
        "idempotency_key": idempotency_key,
        "request_hash": fingerprint,
        "ttl_seconds": receipt_ttl_seconds,
        # Taken by the statement itself, first, unless an earlier step took them.
        "locks": keys if locks else [],
        "replacement_key": message.replacement_key,
        "trace_context": carried_trace_context(),
    }
    row = yield one("enqueue", write, final=True)
    if row is None:
        # Under the delivery-key lock the statement sees every row its ON CONFLICT waited
        # for; only a row written concurrently without the lock (by hand) can hide from it.
        raise DatabaseError(
            f"an outbox row with delivery key {delivery_key!r} was written concurrently "
            "without leasebox's lock; retry the transaction"
        )
    if row["source"] == "receipt":
        return _reused(row, fingerprint, scope_name, idempotency_key)
    if row["source"] == "conflict":
        raise _delivery_key_conflict(row, scope_name, idempotency_key)
    if row["source"] == "expired":
        raise AlreadyExpired()
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
        delivery_key=found["delivery_key"],
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
    catalogue: Catalogue | None = None,
    check_suppression: bool = False,
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
        catalogue,
        check_suppression,
    )


def _delivery_key_conflict(
    row: dict[str, Any], scope: str, idempotency_key: str | None
) -> IdempotencyConflict:
    return IdempotencyConflict(
        scope, idempotency_key or "", int(row["outbox_id"]), delivery_key=row["delivery_key"]
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
    catalogue: Catalogue | None = None,
    check_suppression: bool = False,
    policy: RecipientPolicy | None = None,
) -> Receipt:
    """Write `message` to the outbox in the caller's open transaction; never commits.

    On a connection in autocommit mode the send commits before this returns, in one
    statement or, with a guard or a suppression check, in a transaction of its own.

    With an `idempotency_key`, the same `(scope, key)` returns the first outbox id with
    `reused=True`, and a different request under the same key raises `IdempotencyConflict`.
    `request_hash` overrides the default fingerprint (e.g. a hash of the HTTP body). A kind,
    template or required variable the `catalogue` (default: the process-wide one) does not
    know is an `InvalidMessage`, before any SQL.
    `check_suppression` refuses a mailbox on the scope's suppression list with
    `RecipientSuppressed` (one more statement, in the same round trip as the key's lock);
    `policy` refuses an address the domain policy rejects with `RecipientRefused`, before
    any SQL. Either way nothing is written.
    """
    if policy is not None:
        policy.check(message.recipient)
    plan = _plan(
        message,
        idempotency_key,
        scope,
        request_hash,
        guard,
        receipt_ttl_seconds,
        cipher or default_cipher(),
        catalogue,
        check_suppression,
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
    catalogue: Catalogue | None = None,
    check_suppression: bool = False,
    policy: RecipientPolicy | None = None,
) -> Receipt:
    """`enqueue` for an async connection; the same semantics (the policy's MX lookup, if it
    makes one, does not block the event loop)."""
    if policy is not None:
        await policy.check_async(message.recipient)
    plan = _plan(
        message,
        idempotency_key,
        scope,
        request_hash,
        guard,
        receipt_ttl_seconds,
        cipher or default_cipher(),
        catalogue,
        check_suppression,
    )
    return await run_async(conn, plan, schema)
