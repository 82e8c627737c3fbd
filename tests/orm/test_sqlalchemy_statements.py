"""The producer's statements translate faithfully to SQLAlchemy, and misuse is a clear error."""

from __future__ import annotations

import re

import pytest

import leasebox.sqlalchemy
from leasebox import OutboxMessage
from leasebox.db.queries import query_names
from leasebox.producer.portable import named_binds, statement_text
from leasebox.sqlalchemy import statement


@pytest.mark.parametrize("name", query_names())
def test_every_named_statement_becomes_text_with_the_same_binds(name: str) -> None:
    original = statement_text(name, "leasebox")
    translated, names = named_binds(name, "leasebox")

    assert set(re.findall(r"%\((\w+)\)[sb]", original)) == names
    clause = statement(name, dict.fromkeys(names), "leasebox")
    assert set(clause.compile().params) == names
    assert "%(" not in translated


def test_a_bind_followed_by_a_cast_stays_a_bind() -> None:
    translated, names = named_binds("enqueue", "leasebox")
    assert "available_at" in names
    assert ":available_at ::timestamptz" in translated


def test_a_statement_missing_a_parameter_names_it() -> None:
    with pytest.raises(KeyError, match="scope"):
        statement("find_receipt", {"idempotency_key": "k"}, "leasebox")


def test_a_psycopg_connection_is_not_a_session() -> None:
    with pytest.raises(TypeError, match="Session or a Connection"):
        leasebox.sqlalchemy.enqueue(
            object(),  # type: ignore[arg-type]
            OutboxMessage(kind="otp", recipient="ada@example.com"),
        )


async def test_a_sync_session_given_to_enqueue_async_is_refused() -> None:
    from sqlalchemy.orm import Session

    with pytest.raises(TypeError, match="AsyncSession or an AsyncConnection"):
        await leasebox.sqlalchemy.enqueue_async(
            Session(),  # type: ignore[arg-type]
            OutboxMessage(kind="otp", recipient="ada@example.com"),
        )
