"""Invalid messages are rejected with an error that names the field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from leasebox import InvalidMessage, LeaseboxError, OutboxMessage
from leasebox.messages import MAX_DATA_BYTES, visible


def errors_for(**fields: Any) -> dict[str, str]:
    base: dict[str, Any] = {"kind": "otp", "recipient": "ada@example.com"}
    base.update(fields)
    with pytest.raises(InvalidMessage) as caught:
        OutboxMessage(**base)
    cause = caught.value.__cause__
    assert isinstance(cause, ValidationError)
    return {".".join(map(str, e["loc"])) or "message": e["msg"] for e in cause.errors()}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kind": "OTP"}, "kind"),
        ({"kind": "otp code"}, "kind"),
        ({"recipient": "not-an-address"}, "recipient"),
        ({"recipient": "a@b"}, "recipient"),
        ({"recipient": "a..b@example.com"}, "recipient"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"data": {"blob": "x" * (MAX_DATA_BYTES + 1)}}, "data"),
        ({"data": {"when": datetime(2026, 1, 1)}}, "data"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at"),
        ({"delivery_key": "has space"}, "delivery_key"),
        ({"secrets": {"not an identifier": "1"}}, "secrets"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_an_invalid_field_is_named_in_the_error(fields: dict[str, Any], field: str) -> None:
    assert field in errors_for(**fields)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"data": {"name": "Ada\x00"}}, "data"),
        ({"data": {"na\x00me": "Ada"}}, "data"),
        ({"data": {"deep": [{"x": ["\x00"]}]}}, "data"),
        ({"data": {"name": "\ud800"}}, "data"),
        ({"aggregate_id": "user\x001"}, "aggregate_id"),
        ({"aggregate_id": "user\udfff"}, "aggregate_id"),
        ({"secrets": {"code": "49\x003817"}}, "secrets"),
        ({"secrets": {"code": "\udc80"}}, "secrets"),
        ({"recipient": "ada\x00@example.com"}, "recipient"),
        ({"recipient": "ada@exa\ud800mple.com"}, "recipient"),
        ({"recipient": "ad a@example.com"}, "recipient"),
        ({"delivery_key": "otp:\x00"}, "delivery_key"),
    ],
)
def test_what_postgresql_cannot_store_is_rejected_before_any_sql(
    fields: dict[str, Any], field: str
) -> None:
    assert field in errors_for(**fields)


def test_a_validation_error_never_quotes_the_input_it_refused() -> None:
    with pytest.raises(InvalidMessage) as caught:
        OutboxMessage(kind="otp", recipient="a@example.com", secrets={"code": "49\x00381777"})
    assert "381777" not in str(caught.value)
    assert "381777" not in str(caught.value.__cause__)


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (
            {"recipient": "not-an-address"},
            "invalid message: recipient: not a valid email address",
        ),
        (
            {"kind": "OTP"},
            "invalid message: kind: must start with a lower-case letter, then up to 62 "
            "lower-case letters, digits or '_'",
        ),
        (
            {"secrets": {"code": 493817}},
            "invalid message: secrets.code: Input should be a valid string",
        ),
        (
            {"expires_at": datetime(2001, 1, 1, tzinfo=UTC)},
            "invalid message: expires_at: is already in the past",
        ),
        (
            {"recipient": "nobody", "max_attempts": 0, "colour": "red"},
            "invalid message: recipient: not a valid email address "
            "(and 2 more: max_attempts, colour)",
        ),
    ],
)
def test_an_invalid_message_is_one_line_naming_the_field_with_pydantics_report_as_cause(
    fields: dict[str, Any], line: str
) -> None:
    base: dict[str, Any] = {"kind": "otp", "recipient": "ada@example.com", **fields}
    with pytest.raises(InvalidMessage) as caught:
        OutboxMessage(**base)
    assert str(caught.value) == line
    assert isinstance(caught.value, LeaseboxError)
    assert isinstance(caught.value.__cause__, ValidationError)
    assert caught.value.field == line.split(": ")[1]


def test_model_validate_and_json_refuse_with_the_same_one_line_error() -> None:
    with pytest.raises(InvalidMessage, match=r"^invalid message: recipient: "):
        OutboxMessage.model_validate({"kind": "otp", "recipient": "x"})
    with pytest.raises(InvalidMessage, match=r"^invalid message: recipient: "):
        OutboxMessage.model_validate_json('{"kind": "otp", "recipient": "x"}')


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("Ada@Example.COM", "ada@example.com"),
        ("  ada@example.com\t", "ada@example.com"),
        ("ADA@Bücher.de", "ada@xn--bcher-kva.de"),
        ("ada@XN--BCHER-KVA.DE", "ada@xn--bcher-kva.de"),
    ],
)
def test_recipients_are_normalised_once_and_kept_as_given(given: str, key: str) -> None:
    message = OutboxMessage(kind="otp", recipient=given)
    assert message.recipient == given.strip()
    assert message.recipient_key == key


@pytest.mark.parametrize(
    "text",
    [chr(c) for c in range(128)]
    + ["\u00a0", "\u2028", "\u200b", "\u3000", "\ufeff", "é", "ü", "日", "ada@bücher.de"],
)
def test_the_ascii_shortcut_sees_exactly_the_characters_that_are_printable_and_not_space(
    text: str,
) -> None:
    assert visible(f"a{text}b") is all(c.isprintable() and not c.isspace() for c in text)


def test_a_bad_template_name_is_rejected() -> None:
    messages = errors_for(template="../etc/passwd")
    assert any("template" in text for text in messages.values())


def test_the_template_defaults_to_the_kind() -> None:
    assert OutboxMessage(kind="verification", recipient="a@example.com").template == "verification"


def test_secrets_never_appear_in_the_repr() -> None:
    message = OutboxMessage(kind="otp", recipient="a@example.com", secrets={"code": "493817"})
    assert "493817" not in repr(message)


def test_the_request_hash_ignores_secrets_and_recipient_case() -> None:
    a = OutboxMessage(kind="otp", recipient="Ada@example.com", secrets={"code": "1"})
    b = OutboxMessage(kind="otp", recipient="ada@example.com", secrets={"code": "2"})
    c = OutboxMessage(kind="otp", recipient="ada@example.com", data={"x": 1})
    assert a.request_hash() == b.request_hash() != c.request_hash()
