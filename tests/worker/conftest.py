"""Fixtures for the worker's tests: a database clock, async pools (one counting its statements),
rows inserted by hand."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.producer.payload_crypto import PayloadCipher
from support.counted_statements import Statements
from support.outbox_rows import insert_message
from support.worker_doubles import Insert, ManualClock, ScriptedProvider


@pytest.fixture
def fake_provider() -> ScriptedProvider:
    return ScriptedProvider()


@pytest.fixture
def db_now(db_conn: psycopg.Connection) -> datetime:
    row = db_conn.execute("SELECT now()").fetchone()
    db_conn.rollback()
    assert row is not None
    value: datetime = row[0]
    return value


@pytest.fixture
def fake_clock(db_now: datetime) -> ManualClock:
    return ManualClock(db_now)


@pytest.fixture
async def db_pool(db_dsn: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(
        db_dsn, min_size=1, max_size=4, timeout=5, kwargs={"autocommit": True}
    ) as opened:
        yield opened


@pytest.fixture
async def db_aconn(db_dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def db_insert(db_conn: psycopg.Connection, db_now: datetime) -> Insert:
    """Insert one message (committed) and return its id; fields override the defaults.

    Rows are ready a second before `db_now`, the time the injected clock starts at.
    """
    cipher = PayloadCipher(allow_plaintext=True)  # rows as a development producer writes them

    def insert_row(**fields: Any) -> int:
        code = fields.pop("code", "424242")
        row = {
            "kind": "otp",
            "aggregate_id": "user-1",
            "recipient": f"{uuid.uuid4().hex[:8]}@example.com",
            "template": "otp",
            "data": json.dumps({"minutes_valid": 10}),
            "secrets": cipher.seal({"code": code}),
            "delivery_key": f"otp:{uuid.uuid4().hex}",
            "max_attempts": 8,
            "available_at": db_now - timedelta(seconds=1),
            **fields,
        }
        outbox_id = insert_message(db_conn, **row)
        db_conn.commit()
        return outbox_id

    return insert_row


@pytest.fixture
def statements() -> Statements:
    """The statements sent through `counted_pool`'s connections, by query name."""
    return Statements()


@pytest.fixture
async def counted_pool(db_dsn: str, statements: Statements) -> AsyncIterator[AsyncConnectionPool]:
    """A pool on the test's database whose every statement `statements` counts."""

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        conn.cursor_factory = statements.cursor_class()

    async with AsyncConnectionPool(
        db_dsn, min_size=1, max_size=2, timeout=5, kwargs={"autocommit": True}, configure=configure
    ) as pool:
        yield pool
