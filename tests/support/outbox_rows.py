"""What the producer tests build and count: one OTP message, and the rows of a table.

Several suites enqueue the same kind of message and check how many rows a call wrote; they
share these so that a change to the message (a new required field, say) is made once.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from leasebox import OutboxMessage


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
