"""What a claim hands the worker: rows whose content is decoded only when a provider reads
it, and whose repr never shows the recipient or the content."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from leasebox.messages import JsonObject, LazyJsonBinaryLoader, register_lazy_json
from leasebox.store.claiming import ClaimedMessage


def test_a_json_object_decodes_on_first_use_and_reads_like_a_dict() -> None:
    lazy = JsonObject(b'{"name": "Ada", "minutes_valid": 10}')
    assert lazy._decoded is None  # nothing decoded yet

    assert {**lazy, "code": "1"} == {"name": "Ada", "minutes_valid": 10, "code": "1"}
    assert lazy["name"] == "Ada"
    assert len(lazy) == 2
    assert sorted(lazy) == ["minutes_valid", "name"]
    assert lazy._decoded == {"name": "Ada", "minutes_valid": 10}


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_a_connection_with_the_lazy_loader_reads_jsonb_as_json_objects(
    db_conn: psycopg.Connection[Any], binary: bool
) -> None:
    register_lazy_json(db_conn)
    with db_conn.cursor(binary=binary) as cur:
        row = cur.execute("""SELECT '{"a": [1, 2], "b": "é"}'::jsonb""").fetchone()

    assert row is not None
    assert isinstance(row[0], JsonObject)
    assert dict(row[0]) == {"a": [1, 2], "b": "é"}


def test_the_lazy_loader_refuses_a_binary_jsonb_of_an_unknown_version() -> None:
    with pytest.raises(ValueError, match="unknown jsonb binary format version"):
        LazyJsonBinaryLoader(0).load(b'\x02{"a": 1}')


def test_a_claimed_rows_repr_leaves_out_the_recipient_and_the_content() -> None:
    now = datetime.now(UTC)
    message = ClaimedMessage(
        1, "otp", "user-1", "ada@example.com", "otp", {"name": "Ada Lovelace"}, b"sealed",
        "otp:k", 1, None, None, str(uuid.uuid4()), now, now, now, now,
    )  # fmt: skip

    shown = repr(message)
    assert "otp:k" in shown
    assert "user-1" in shown
    for hidden in ("ada@example.com", "Ada Lovelace", "sealed"):
        assert hidden not in shown
    assert message.lease.id == 1
    assert message.lease.token == message.lease_token
