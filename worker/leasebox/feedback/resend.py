"""Resend's webhooks, signed the Svix way: HMAC-SHA256 over id, timestamp and body.

Headers `svix-id`, `svix-timestamp` and `svix-signature` (or their Standard Webhooks names,
`webhook-*`); the signature header lists one or more `v1,<base64>` values, each the HMAC of
`{id}.{timestamp}.{body}` under the endpoint's secret (`whsec_<base64>`), so a secret
rotates while both are accepted. The timestamp must be within `tolerance_seconds` of the
receiver's clock. A retried delivery carries the same id and payload, and stores nothing
new. Events: `email.delivered`, `email.delivery_delayed`, `email.bounced` (its `bounce.type`
`Permanent` or `Transient`), `email.complained`, `email.failed`, `email.suppressed`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any

from leasebox.feedback.events import (
    HARD,
    SOFT,
    BadPayload,
    EventType,
    FeedbackEvent,
    address,
    bounce_class_of,
    clean,
    json_object,
    moment,
    sender_domain,
    smtp_status,
    text_field,
)
from leasebox.feedback.events import field as path
from leasebox.feedback.signing import (
    DEFAULT_TOLERANCE_SECONDS,
    Inbound,
    any_equal,
    forged,
    signed_time,
    unsigned,
)

_TYPES = {
    "email.delivered": EventType.DELIVERED,
    "email.delivery_delayed": EventType.DEFERRED,
    "email.bounced": EventType.BOUNCED,
    "email.complained": EventType.COMPLAINED,
    "email.failed": EventType.REJECTED,
    "email.suppressed": EventType.SUPPRESSED,
}


def secret_key(secret: str) -> bytes:
    """The HMAC key of an endpoint secret (`whsec_` followed by base64)."""
    try:
        return base64.b64decode(secret.strip().removeprefix("whsec_"), validate=True)
    except binascii.Error:
        raise ValueError("a Resend webhook secret is whsec_ followed by base64") from None


@dataclass(frozen=True)
class ResendSettings:
    """The endpoint's signing secrets (several while one rotates)."""

    secrets: tuple[str, ...]
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS
    keys: tuple[bytes, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.secrets:
            raise ValueError("Resend's webhooks need at least one signing secret")
        object.__setattr__(self, "keys", tuple(secret_key(s) for s in self.secrets))


def _header(inbound: Inbound, name: str) -> str:
    return inbound.header(f"svix-{name}") or inbound.header(f"webhook-{name}")


def verify(inbound: Inbound, settings: ResendSettings) -> None:
    """Raise `Refused` unless one of the signatures is a configured secret's, and recent."""
    message_id, timestamp = _header(inbound, "id"), _header(inbound, "timestamp")
    signatures = _header(inbound, "signature")
    if not message_id or not timestamp or not signatures:
        raise unsigned()
    signed_time(timestamp, inbound.now, settings.tolerance_seconds)
    content = f"{message_id}.{timestamp}.".encode() + inbound.body
    given = [
        value.encode()
        for version, _, value in (part.partition(",") for part in signatures.split())
        if version == "v1" and value
    ]
    expected = [
        base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()) for key in settings.keys
    ]
    if not any_equal(expected, given):
        raise forged()


def parse(body: bytes) -> list[FeedbackEvent]:
    """The delivery events of one Resend webhook request, one per recipient."""
    item = json_object(body, "a Resend body")
    if not isinstance(item.get("data"), dict):
        raise BadPayload("a Resend body has data")
    kind = _TYPES.get(str(item.get("type")))
    if kind is None:
        return []
    data: dict[str, Any] = item["data"]
    recipients = data.get("to")
    if isinstance(recipients, str):
        recipients = [recipients]
    if not isinstance(recipients, list) or not recipients:
        raise BadPayload("the event names no recipient")
    bounce_message = clean(path(data, "bounce", "message"))
    status = smtp_status(bounce_message)
    bounce: str | None = None
    if kind is EventType.BOUNCED:
        permanent = path(data, "bounce", "type") == "Permanent"
        bounce = bounce_class_of(status, HARD if permanent else SOFT)
    detail = bounce_message or clean(path(data, "bounce", "subType")) or clean(data.get("reason"))
    return [
        FeedbackEvent(
            provider_message_id=text_field(data, "email_id", required=True),
            recipient=address(recipient),
            type=kind,
            occurred_at=moment(item.get("created_at")),
            bounce_class=bounce,
            smtp_status=status,
            detail=None if kind is EventType.DELIVERED else detail,
            sending_domain=sender_domain(data.get("from")),
        )
        for recipient in recipients
    ]
