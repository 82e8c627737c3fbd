"""What the producer tests build and count: one OTP message, and the rows of a table.

Several suites enqueue the same kind of message and check how many rows a call wrote; they
share these so that a change to the message (a new required field, say) is made once.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from leasebox import OutboxMessage
from leasebox.producer.payload_crypto import PayloadCipher, generate_key

# Seals the code of an `otp()` for a test that has no keys configured and does not look at it.
SEALING = PayloadCipher([generate_key()])


def otp(recipient: str = "ada@example.com", **overrides: Any) -> OutboxMessage:
    """A login-code message for `recipient`, with a secret code; `overrides` replace fields."""
    fields: dict[str, Any] = {
        "kind": "otp",
        "recipient": recipient,
        "aggregate_id": "user-1",
        "data": {"minutes_valid": 10},
        "secrets": {"code": "493817"},
    }
    fields.update(overrides)
    return OutboxMessage(**fields)


def count(conn: psycopg.Connection[Any], table: str, *, schema: str = "leasebox") -> int:
    """How many rows `table` of the leasebox schema holds."""
    statement = sql.SQL("SELECT count(*) FROM {}.{}").format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    row = conn.execute(statement).fetchone()
    assert row is not None
    return int(row[0])


# Where each field of a message written by hand goes: what the producer wrote (`outbox`),
# where the message is (`queue`, for a message not sent), or both.
_OUTBOX_FIELDS = frozenset(
    {
        "kind",
        "aggregate_id",
        "recipient",
        "recipient_key",
        "scope",
        "message_hash",
        "template",
        "data",
        "secrets",
        "delivery_key",
    }
)
_SHARED_FIELDS = frozenset({"max_attempts", "expires_at", "created_at"})
_QUEUE_FIELDS = frozenset(
    {
        "attempts",
        "available_at",
        "lease_token",
        "lease_expires_at",
        "leased_by",
        "last_error",
        "last_error_class",
        "dead_reason",
        "updated_at",
    }
)
_SENT_FIELDS = frozenset({"sent_at", "provider_message_id"})


def insert_message(
    conn: psycopg.Connection[Any], *, schema: str = "leasebox", **fields: Any
) -> int:
    """Write one message by hand, the way the producer and the worker would have left it.

    `status` (default `pending`) says where: `pending`, `processing` or `dead` write its queue
    row too; `sent` writes the `sent` history row instead (`sent_at`, `provider_message_id`,
    `attempts`, `leased_by`), as a worker that sent it would, and a sent message has no queue
    row for the other queue fields to go to. `created_at` (which decides the message's day
    partition) defaults to now, or to `sent_at`. Returns the message's id; the caller commits.
    """
    status = fields.pop("status", "pending")
    unknown = set(fields) - _OUTBOX_FIELDS - _SHARED_FIELDS - _QUEUE_FIELDS - _SENT_FIELDS
    if unknown:
        raise TypeError(f"insert_message() got fields no table holds: {sorted(unknown)}")
    if status == "sent":
        fields.setdefault("created_at", fields.get("sent_at"))
        if fields["created_at"] is None:
            del fields["created_at"]
    message = {k: v for k, v in fields.items() if k in _OUTBOX_FIELDS | _SHARED_FIELDS}
    queued = {k: v for k, v in fields.items() if k in _QUEUE_FIELDS | _SHARED_FIELDS}
    queued.pop("created_at", None)
    params = {
        **{f"m_{k}": v for k, v in message.items()},
        **{f"q_{k}": v for k, v in queued.items()},
        "created_at": fields.get("created_at"),
        "status": status,
        "sent_at": fields.get("sent_at"),
        "provider_message_id": fields.get("provider_message_id"),
        "attempts": fields.get("attempts", 1),
        "leased_by": fields.get("leased_by"),
    }
    table = sql.Identifier(schema)
    statement = sql.SQL(
        "WITH m AS ("
        " INSERT INTO {schema}.outbox (bucket, {m_columns})"
        " VALUES ((coalesce(%(created_at)s::timestamptz, now()) AT TIME ZONE 'UTC')::date,"
        " {m_values})"
        " RETURNING id, bucket, kind, aggregate_id, delivery_key, created_at),"
        " q AS ("
        " INSERT INTO {schema}.queue"
        " (id, bucket, kind, aggregate_id, delivery_key, created_at, status{q_columns})"
        " SELECT id, bucket, kind, aggregate_id, delivery_key, created_at, %(status)s{q_values}"
        " FROM m WHERE %(status)s <> 'sent'),"
        " h AS ("
        " INSERT INTO {schema}.history"
        " (outbox_id, bucket, kind, event, at, attempt, worker_id, provider_message_id)"
        " SELECT id, bucket, kind, 'sent', coalesce(%(sent_at)s::timestamptz, now()),"
        " %(attempts)s, %(leased_by)s, %(provider_message_id)s"
        " FROM m WHERE %(status)s = 'sent')"
        " SELECT id FROM m"
    ).format(
        schema=table,
        m_columns=sql.SQL(", ").join(map(sql.Identifier, message)),
        m_values=sql.SQL(", ").join(sql.Placeholder(f"m_{k}") for k in message),
        q_columns=sql.SQL("").join(sql.SQL(", {}").format(sql.Identifier(k)) for k in queued),
        q_values=sql.SQL("").join(
            sql.SQL(", {}").format(sql.Placeholder(f"q_{k}")) for k in queued
        ),
    )
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    return int(row[0])


def insert_receipt(
    conn: psycopg.Connection[Any],
    outbox_id: int,
    key: str,
    *,
    expires_at: Any,
    scope: str = "s",
    request_hash: str = "h",
    schema: str = "leasebox",
) -> None:
    """Write a receipt by hand for a message, in the partition of the day it expires, the way
    `enqueue` writes one; the caller commits."""
    statement = sql.SQL(
        "INSERT INTO {schema}.receipts (scope, idempotency_key, bucket, request_hash, outbox_id,"
        " outbox_bucket, expires_at)"
        " SELECT %(scope)s, %(key)s, (%(expires_at)s::timestamptz AT TIME ZONE 'UTC')::date,"
        " %(request_hash)s, id, bucket, %(expires_at)s FROM {schema}.outbox WHERE id = %(id)s"
    ).format(schema=sql.Identifier(schema))
    params = {
        "scope": scope,
        "key": key,
        "expires_at": expires_at,
        "request_hash": request_hash,
        "id": outbox_id,
    }
    assert conn.execute(statement, params).rowcount == 1


def insert_backlog(
    conn: psycopg.Connection[Any], count: int, *, prefix: str = "backlog", kind: str = "otp"
) -> None:
    """Write `count` ready messages of `kind` in one statement (their outbox and queue rows),
    with unique delivery keys starting with `prefix`; the caller commits."""
    conn.execute(
        "WITH m AS ("
        " INSERT INTO leasebox.outbox (bucket, kind, recipient, template, delivery_key)"
        " SELECT (now() AT TIME ZONE 'UTC')::date, %(kind)s, 'user' || i || '@example.com',"
        " %(kind)s, %(prefix)s || ':' || i || ':' || gen_random_uuid()"
        " FROM generate_series(1, %(count)s) AS i"
        " RETURNING id, bucket, kind, delivery_key, created_at)"
        " INSERT INTO leasebox.queue (id, bucket, kind, delivery_key, created_at)"
        " SELECT id, bucket, kind, delivery_key, created_at FROM m",
        {"count": count, "prefix": prefix, "kind": kind},
    )
