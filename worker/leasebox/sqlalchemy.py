"""Enqueue inside a SQLAlchemy transaction: `leasebox.sqlalchemy.enqueue(session, message, ...)`
for a `Session` or `Connection`, `enqueue_async` for their async twins (installed with
`leasebox[sqlalchemy]`), with the keyword arguments of `leasebox.enqueue`.

Most services write their business change through SQLAlchemy, so the outbox row has to be
written on the session's own connection, in the session's own transaction: flushed with it,
committed with it, rolled back with it. These functions run the producer plan (the same one
`leasebox.enqueue` runs, `producer.enqueue.plan_enqueue`) through SQLAlchemy rather than
through psycopg directly, which is what makes them work on any PostgreSQL driver the engine
uses: psycopg 3 and asyncpg alike. Each statement becomes a `text()` construct with typed
bind parameters, so SQLAlchemy renders the driver's paramstyle and, for asyncpg, the casts
and JSON encoding that driver needs. Nothing here commits, rolls back or retries.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import BigInteger, Boolean, DateTime, Float, LargeBinary, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.types import TypeEngine

from leasebox.catalogue import Catalogue
from leasebox.db.queries import DEFAULT_SCHEMA
from leasebox.messages import OutboxMessage, Receipt
from leasebox.producer.enqueue import DEFAULT_RECEIPT_TTL_SECONDS, plan_enqueue
from leasebox.producer.guard import AbuseGuard
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.producer.plan import Row
from leasebox.producer.portable import drive, drive_async, named_binds
from leasebox.producer.recipients import RecipientPolicy

__all__ = ["enqueue", "enqueue_async"]

SyncTarget = Session | Connection
AsyncTarget = AsyncSession | AsyncConnection


def _bind_type(value: object) -> TypeEngine[Any] | None:
    """The SQL type of a parameter, so that every driver encodes and casts it the same way.

    None stays untyped: PostgreSQL infers the parameter's type from where it is used.
    """
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ARRAY(Text())  # keys, such as the advisory locks a statement takes
    if isinstance(value, Jsonb | dict | list):
        return JSONB()
    if isinstance(value, bool):
        return Boolean()
    if isinstance(value, int):
        return BigInteger()
    if isinstance(value, float):
        return Float()
    if isinstance(value, str):
        return Text()
    if isinstance(value, bytes | bytearray | memoryview):
        return LargeBinary()
    if isinstance(value, datetime):
        return DateTime(timezone=value.tzinfo is not None)
    return None


def statement(name: str, params: dict[str, Any], schema: str) -> TextClause:
    """The named producer statement as a `text()` construct bound to `params`."""
    sql, names = named_binds(name, schema)
    missing = names - params.keys()
    if missing:
        raise KeyError(f"query {name!r} needs parameters {sorted(missing)}")
    binds = []
    for key in sorted(names):
        value = params[key]
        if isinstance(value, Jsonb):
            value = value.obj
        binds.append(bindparam(key, value, type_=_bind_type(params[key])))
    return text(sql).bindparams(*binds)


def _first_row(result: Any) -> Row:
    found = result.mappings().first()
    return dict(found) if found is not None else None


def _autocommit(pooled: Any) -> bool:
    """Whether the DBAPI connection under SQLAlchemy's commits every statement (the
    `AUTOCOMMIT` isolation level): psycopg's connection and SQLAlchemy's adapters of the
    async drivers all say so in `autocommit`."""
    return bool(getattr(pooled.dbapi_connection, "autocommit", False))


def _connection(target: SyncTarget) -> Connection:
    if isinstance(target, Session):
        return target.connection()
    if isinstance(target, Connection):
        return target
    raise TypeError(
        "leasebox.sqlalchemy.enqueue takes a Session or a Connection; "
        "use enqueue_async for an AsyncSession or AsyncConnection"
    )


async def _async_connection(target: AsyncTarget) -> AsyncConnection:
    if isinstance(target, AsyncSession):
        return await target.connection()
    if isinstance(target, AsyncConnection):
        return target
    raise TypeError(
        "leasebox.sqlalchemy.enqueue_async takes an AsyncSession or an AsyncConnection; "
        "use enqueue for a Session or Connection"
    )


def enqueue(
    session: SyncTarget,
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
    """`leasebox.enqueue` on a SQLAlchemy `Session` or `Connection`; never commits.

    The row is written on the session's connection inside its current transaction (begun
    now if none is), so it commits and rolls back with the caller's change. On a connection
    in `AUTOCOMMIT` a plain enqueue commits by itself; one with a `guard` or
    `check_suppression`, whose statements must share a transaction, is refused with a
    `ConfigurationError` before any of them runs.
    """
    if policy is not None:
        policy.check(message.recipient)
    conn = _connection(session)
    plan = plan_enqueue(
        message,
        idempotency_key=idempotency_key,
        scope=scope,
        request_hash=request_hash,
        guard=guard,
        receipt_ttl_seconds=receipt_ttl_seconds,
        cipher=cipher,
        catalogue=catalogue,
        check_suppression=check_suppression,
    )

    def execute(name: str, params: dict[str, Any]) -> Row:
        return _first_row(conn.execute(statement(name, params, schema)))

    return drive(plan, execute, autocommit=_autocommit(conn.connection))


async def enqueue_async(
    session: AsyncTarget,
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
    """`enqueue` on an `AsyncSession` or `AsyncConnection`; the same semantics."""
    if policy is not None:
        await policy.check_async(message.recipient)
    conn = await _async_connection(session)
    plan = plan_enqueue(
        message,
        idempotency_key=idempotency_key,
        scope=scope,
        request_hash=request_hash,
        guard=guard,
        receipt_ttl_seconds=receipt_ttl_seconds,
        cipher=cipher,
        catalogue=catalogue,
        check_suppression=check_suppression,
    )

    async def execute(name: str, params: dict[str, Any]) -> Row:
        return _first_row(await conn.execute(statement(name, params, schema)))

    autocommit = _autocommit(await conn.get_raw_connection())
    return await drive_async(plan, execute, autocommit=autocommit)
