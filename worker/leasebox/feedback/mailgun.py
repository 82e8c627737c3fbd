"""Mailgun's webhooks: HMAC-SHA256 over timestamp and token, a time window and no replays.

Each request carries `signature: {timestamp, token, signature}` beside `event-data`; the
signature is the hex HMAC-SHA256 of `timestamp + token` under the webhook signing key. A
request is accepted only within `tolerance_seconds` of its timestamp and only once per
token: the token is remembered in PostgreSQL (`feedback_tokens`), by the same statement that
stores the events, so every receiver replica shares the cache and a replay is refused even
by another one. Events: `delivered`, `failed` (`severity` `permanent` or `temporary`; a
`reason` of `suppress-*` means Mailgun's own list), `complained`, `rejected`.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from leasebox.feedback.events import (
    HARD,
    BadPayload,
    EventType,
    FeedbackEvent,
    address,
    bounce_class_of,
    clean,
    field,
    json_object,
    moment,
    sender_domain,
    smtp_status,
    text_field,
)
from leasebox.feedback.signing import (
    DEFAULT_TOLERANCE_SECONDS,
    Inbound,
    Refused,
    any_equal,
    forged,
    signed_time,
    unsigned,
)


@dataclass(frozen=True)
class MailgunSettings:
    """The webhook signing keys (several while one rotates)."""

    signing_keys: tuple[str, ...]
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS

    def __post_init__(self) -> None:
        if not self.signing_keys or not all(self.signing_keys):
            raise ValueError("Mailgun's webhooks need at least one signing key")


def _load(body: bytes) -> dict[str, Any]:
    return json_object(body, "a Mailgun body")


def verify(inbound: Inbound, settings: MailgunSettings) -> str:
    """The request's token, if a configured key signed it recently; else `Refused`.

    The caller refuses a token it has seen before (`feedback_tokens`)."""
    signature = _load(inbound.body).get("signature")
    if not isinstance(signature, dict):
        raise unsigned()
    timestamp, token, digest = (signature.get(k) for k in ("timestamp", "token", "signature"))
    if not all(isinstance(v, str | int) and str(v) for v in (timestamp, token, digest)):
        raise unsigned()
    timestamp, token, digest = str(timestamp), str(token), str(digest)
    if len(token) > 200:
        raise Refused(400, "bad_token")
    signed_time(timestamp, inbound.now, settings.tolerance_seconds)
    message = (timestamp + token).encode()
    expected = [
        hmac.new(key.encode(), message, hashlib.sha256).hexdigest().encode()
        for key in settings.signing_keys
    ]
    if not any_equal(expected, [digest.lower().encode()]):
        raise forged()
    return token


def parse(body: bytes) -> list[FeedbackEvent]:
    """The delivery event of one Mailgun webhook request (none for other events)."""
    data = field(_load(body), "event-data")
    if not isinstance(data, dict):
        raise BadPayload("a Mailgun body has event-data")
    name = data.get("event")
    if name not in ("delivered", "failed", "complained", "rejected"):
        return []
    status_info = (
        data.get("delivery-status") if isinstance(data.get("delivery-status"), dict) else {}
    )
    status = smtp_status(
        field(status_info, "enhanced-code"),
        field(status_info, "message"),
        field(status_info, "description"),
    )
    detail = clean(field(status_info, "message")) or clean(field(status_info, "description"))
    reason = str(data.get("reason") or "")
    kind: EventType
    bounce: str | None = None
    if name == "delivered":
        kind, detail = EventType.DELIVERED, None
    elif name == "complained":
        kind = EventType.COMPLAINED
    elif name == "rejected":
        kind, detail = EventType.REJECTED, clean(field(data, "reject", "reason")) or detail
    elif reason.startswith("suppress-"):
        kind, detail = EventType.SUPPRESSED, clean(reason)
    elif data.get("severity") == "temporary":
        kind = EventType.DEFERRED
    else:
        kind, bounce = EventType.BOUNCED, bounce_class_of(status, HARD)
    message_id = text_field(data, "message", "headers", "message-id", required=True)
    return [
        FeedbackEvent(
            provider_message_id=message_id.strip("<>"),
            recipient=address(data.get("recipient")),
            type=kind,
            occurred_at=moment(data.get("timestamp")),
            bounce_class=bounce,
            smtp_status=status,
            detail=detail,
            sending_domain=sender_domain(field(data, "envelope", "sender"))
            or sender_domain(field(data, "message", "headers", "from")),
        )
    ]
