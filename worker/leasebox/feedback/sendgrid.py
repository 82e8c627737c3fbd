"""SendGrid's signed Event Webhook: ECDSA (P-256, SHA-256) over the timestamp and the body.

SendGrid signs `timestamp + body` with the account's private key and sends the signature
(base64 DER) in `X-Twilio-Email-Event-Webhook-Signature` and the Unix time in
`X-Twilio-Email-Event-Webhook-Timestamp`; the public key is shown in the webhook's settings
(base64 DER, or PEM). The body is a JSON array of events: `delivered`, `deferred`, `bounce`
(`type` `bounce` or `blocked`), `dropped` (an address SendGrid suppresses is one of its
reasons), `spamreport`; the others (`processed`, opens, clicks) are not about delivery.
`sg_message_id` is the `X-Message-Id` the send returned, followed by `.` and SendGrid's
routing suffix.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from leasebox.feedback.events import (
    HARD,
    SOFT,
    BadPayload,
    EventType,
    FeedbackEvent,
    address,
    bounce_class_of,
    clean,
    json_array,
    moment,
    smtp_status,
    text_field,
)
from leasebox.feedback.signing import (
    DEFAULT_TOLERANCE_SECONDS,
    Inbound,
    forged,
    signed_time,
    unsigned,
)

SIGNATURE = "x-twilio-email-event-webhook-signature"
TIMESTAMP = "x-twilio-email-event-webhook-timestamp"
# `dropped` reasons that mean SendGrid keeps the address on a suppression list of its own.
# ("Invalid" alone: the address is on its list of invalid addresses; "Invalid SMTPAPI header"
# and the like are about the request.)
_SUPPRESSING = frozenset(
    {"bounced address", "spam reporting address", "unsubscribed address", "invalid"}
)


def public_key(text: str) -> ec.EllipticCurvePublicKey:
    """A verification key as SendGrid shows it: base64 DER, or PEM."""
    raw = text.strip()
    try:
        if raw.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(raw.encode())
        else:
            key = serialization.load_der_public_key(base64.b64decode(raw, validate=True))
    except (ValueError, binascii.Error):
        raise ValueError("a SendGrid verification key is base64 DER or PEM") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("a SendGrid verification key is an elliptic-curve public key")
    return key


@dataclass(frozen=True)
class SendGridSettings:
    """The webhook's verification keys (several while one rotates)."""

    public_keys: tuple[str, ...]
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS
    keys: tuple[ec.EllipticCurvePublicKey, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(public_key(k) for k in self.public_keys))


def verify(inbound: Inbound, settings: SendGridSettings) -> None:
    """Raise `Refused` unless a configured key signed `timestamp + body` recently."""
    signature, timestamp = inbound.header(SIGNATURE), inbound.header(TIMESTAMP)
    if not signature or not timestamp:
        raise unsigned()
    signed_time(timestamp, inbound.now, settings.tolerance_seconds)
    try:
        raw = base64.b64decode(signature, validate=True)
    except binascii.Error:
        raise forged() from None
    payload = timestamp.encode() + inbound.body
    for key in settings.keys:
        try:
            key.verify(raw, payload, ec.ECDSA(hashes.SHA256()))
            return
        except InvalidSignature:
            continue
    raise forged()


def parse(body: bytes) -> list[FeedbackEvent]:
    """The delivery events of a SendGrid batch."""
    events = []
    for item in json_array(body, "a SendGrid body"):
        found = _event(item)
        if found is not None:
            events.append(found)
    return events


def _event(item: Any) -> FeedbackEvent | None:
    if not isinstance(item, dict):
        raise BadPayload("a SendGrid event is a JSON object")
    name = item.get("event")
    if name not in ("delivered", "deferred", "bounce", "dropped", "spamreport"):
        return None
    message_id = text_field(item, "sg_message_id", required=True).split(".", 1)[0]
    recipient = address(item.get("email"))
    at = moment(item.get("timestamp"))
    reason = clean(item.get("reason"))
    status = smtp_status(item.get("status"), reason, item.get("response"))
    common: dict[str, Any] = {
        "provider_message_id": message_id,
        "recipient": recipient,
        "occurred_at": at,
        "smtp_status": status,
    }
    if name == "delivered":
        return FeedbackEvent(type=EventType.DELIVERED, **common)
    if name == "deferred":
        return FeedbackEvent(type=EventType.DEFERRED, detail=clean(item.get("response")), **common)
    if name == "spamreport":
        return FeedbackEvent(type=EventType.COMPLAINED, **common)
    if name == "dropped":
        suppressing = (reason or "").strip().lower() in _SUPPRESSING
        kind = EventType.SUPPRESSED if suppressing else EventType.REJECTED
        return FeedbackEvent(type=kind, detail=reason, **common)
    blocked = item.get("type") == "blocked"
    bounce = bounce_class_of(status, SOFT if blocked else HARD)
    return FeedbackEvent(type=EventType.BOUNCED, bounce_class=bounce, detail=reason, **common)
