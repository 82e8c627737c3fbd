"""Named queries load and go out compact, schema names are validated, batch arrays read back
intact, and DSNs are never printed with passwords."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from leasebox.db.connections import describe_target, redact_dsn, resolve_dsn
from leasebox.db.queries import query, query_bytes, query_names, text_array, validate_schema_name
from leasebox.errors import ConfigurationError, PayloadKeyError
from leasebox.producer.payload_crypto import PayloadCipher, generate_key
from leasebox.store.claiming import NEVER_AGED, _literal


def test_every_named_query_composes_for_a_custom_schema() -> None:
    names = query_names()
    assert {"claim", "mark_sent", "backlog", "enqueue"} <= set(names)
    for name in names:
        text = query(name, "mail").as_string()
        assert "{schema}" not in text
        assert "leasebox.outbox" not in text
        assert '"leasebox"' not in text


def test_an_unknown_query_name_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no query named"):
        query("nope")


@pytest.mark.parametrize("name", ["leasebox", "mail_2", "_x"])
def test_plain_identifiers_are_valid_schema_names(name: str) -> None:
    assert validate_schema_name(name) == name


def test_the_dsn_comes_from_the_flag_then_leasebox_dsn_then_database_url() -> None:
    env = {"LEASEBOX_DSN": "postgresql://a@h/db", "DATABASE_URL": "postgresql://b@h/db"}
    assert resolve_dsn("postgresql://c@h/db", env) == "postgresql://c@h/db"
    assert resolve_dsn(None, env) == "postgresql://a@h/db"
    assert resolve_dsn(None, {"DATABASE_URL": "postgresql://b@h/db"}) == "postgresql://b@h/db"
    with pytest.raises(ConfigurationError, match="LEASEBOX_DSN"):
        resolve_dsn(None, {})


def test_a_redacted_dsn_hides_the_password() -> None:
    redacted = redact_dsn("postgresql://app:s3cr3t-pw@db.internal:6432/mail")
    assert "s3cr3t-pw" not in redacted
    assert "db.internal" in redacted
    assert describe_target("postgresql://app:s3cr3t-pw@db.internal:6432/mail") == (
        "db.internal:6432/mail"
    )


def test_payload_keys_rotate_and_bad_keys_are_named() -> None:
    old, new = generate_key(), generate_key()
    sealed = PayloadCipher([old]).seal({"code": "1"})
    assert PayloadCipher([new, old]).open(sealed) == {"code": "1"}
    with pytest.raises(PayloadKeyError, match="cannot be decrypted"):
        PayloadCipher([new]).open(sealed)
    with pytest.raises(PayloadKeyError, match="not set"):
        PayloadCipher().open(sealed)
    with pytest.raises(PayloadKeyError, match="Fernet keys"):
        PayloadCipher(["not-a-key"])


# psycopg parses a statement again on every execution when it is longer than this
# (`psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`); the worker's statements stay below it.
PSYCOPG_CACHED_STATEMENT_LENGTH = 4096
HOT_STATEMENTS = ("claim", "claim_without_content", "mark_sent", "extend_leases", "enqueue")


def test_statements_go_out_without_their_comments_and_with_their_name() -> None:
    for name in query_names():
        text = query_bytes(name).decode()
        first, _, body = text.partition("\n")
        assert first == f"/* leasebox {name} */"
        assert "--" not in body, name
        assert all(line and line == line.strip() for line in body.splitlines()), name


@pytest.mark.parametrize("name", HOT_STATEMENTS)
def test_the_workers_statements_are_short_enough_for_psycopg_to_cache(name: str) -> None:
    assert len(query_bytes(name)) <= PSYCOPG_CACHED_STATEMENT_LENGTH


TRICKY_TEXTS = [
    "null:otp:1",
    None,
    "",
    "NULL",
    'a "quoted" id',
    "back\\slash\\",
    "comma,{brace}",
    " spaced ",
    "<0100018c@eu-west-1.amazonses.com>",
    "ünïcödé",
]


@pytest.mark.parametrize(
    "values",
    [
        TRICKY_TEXTS,
        [text for text in TRICKY_TEXTS if text is not None],
        ["null:otp:1", "", "NULL", "comma,{brace}", " spaced ", "ünïcödé"],
        ['"'],
        ["\\"],
        ["one"],
        [],
    ],
)
def test_a_text_array_literal_reads_back_as_the_same_values(
    db_conn: psycopg.Connection[Any], values: list[str | None]
) -> None:
    row = db_conn.execute("SELECT %s::text[]", [text_array(values)]).fetchone()
    assert row is not None
    assert row[0] == values


def test_a_claims_per_kind_arrays_read_back_as_the_same_values(
    db_conn: psycopg.Connection[Any],
) -> None:
    moment = datetime(2026, 12, 7, 1, 2, 3, 456789, tzinfo=UTC)
    values = (
        [moment, None, moment.astimezone(timezone(timedelta(hours=5, minutes=30)))],
        [None, 9_007_199_254_740_993, 0],
        [0, -3, 7],
        [NEVER_AGED, 0.25, 1e-05, float("inf")],
    )
    row = db_conn.execute(
        "SELECT %s::timestamptz[], %s::bigint[], %s::int[], %s::float8[]",
        [_literal(v) for v in values],
    ).fetchone()
    assert row is not None
    assert list(row) == list(values)
