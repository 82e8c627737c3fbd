"""Named queries load, schema names are validated, and DSNs are never printed with passwords."""

from __future__ import annotations

import pytest

from leasebox.db.connections import describe_target, redact_dsn, resolve_dsn
from leasebox.db.queries import query, query_names, validate_schema_name
from leasebox.errors import ConfigurationError, PayloadKeyError
from leasebox.producer.payload_crypto import PayloadCipher, generate_key


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
