"""Invalid messages are rejected with an error that names the field."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from pydantic import ValidationError

from leasebox import OutboxMessage
from leasebox.messages import MAX_DATA_BYTES


def errors_for(**fields: Any) -> dict[str, str]:
    base: dict[str, Any] = {"kind": "otp", "recipient": "ada@example.com"}
    base.update(fields)
    with pytest.raises(ValidationError) as caught:
        OutboxMessage(**base)
    return {".".join(map(str, e["loc"])) or "message": e["msg"] for e in caught.value.errors()}


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
