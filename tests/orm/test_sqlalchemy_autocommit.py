"""The SQLAlchemy adapter on an engine in `AUTOCOMMIT`: one statement commits by itself.

A plain enqueue is one statement there, as with psycopg. A guarded or suppression-checked
one runs several statements that hold the key's lock for one another; SQLAlchemy opens no
transaction in `AUTOCOMMIT`, so the adapter refuses it before any statement runs rather
than let the lock drop between them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import leasebox.sqlalchemy
from leasebox import AbuseGuard, ConfigurationError
from support.orm_producers import sqlalchemy_url
from support.outbox_rows import count, otp

GUARD = AbuseGuard(per_recipient=5, per_scope=None, window_seconds=3600)


def test_a_plain_enqueue_on_an_autocommit_session_commits_by_itself(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(sqlalchemy_url(db_dsn, "psycopg"), isolation_level="AUTOCOMMIT")
    try:
        with Session(engine) as session:
            receipt = leasebox.sqlalchemy.enqueue(session, otp(), idempotency_key="k1")
            # Seen from another session before this one commits or closes.
            assert count(db_conn, "outbox") == 1
    finally:
        engine.dispose()
    assert receipt.reused is False


@pytest.mark.parametrize("options", [{"guard": GUARD}, {"check_suppression": True}])
def test_a_guarded_enqueue_on_an_autocommit_connection_is_refused_and_writes_nothing(
    db_dsn: str, db_conn: psycopg.Connection[Any], options: dict[str, Any]
) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(sqlalchemy_url(db_dsn, "psycopg"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn, pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
            leasebox.sqlalchemy.enqueue(conn, otp(), idempotency_key="k1", **options)
    finally:
        engine.dispose()
    assert count(db_conn, "outbox") == 0


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_an_async_guarded_enqueue_in_autocommit_is_refused_and_a_plain_one_commits(
    db_dsn: str, db_conn: psycopg.Connection[Any], driver: str
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def both() -> None:
        engine = create_async_engine(sqlalchemy_url(db_dsn, driver), isolation_level="AUTOCOMMIT")
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
                    await leasebox.sqlalchemy.enqueue_async(
                        session, otp(), idempotency_key="k1", guard=GUARD
                    )
                assert count(db_conn, "outbox") == 0
                await leasebox.sqlalchemy.enqueue_async(session, otp(), idempotency_key="k1")
                assert count(db_conn, "outbox") == 1
        finally:
            await engine.dispose()

    asyncio.run(both())


def test_a_guarded_enqueue_in_a_transaction_is_not_refused(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(sqlalchemy_url(db_dsn, "psycopg"))
    try:
        with Session(engine) as session:
            leasebox.sqlalchemy.enqueue(session, otp(), idempotency_key="k1", guard=GUARD)
            assert count(db_conn, "outbox") == 0  # not committed yet
            session.commit()
    finally:
        engine.dispose()
    assert count(db_conn, "outbox") == 1
