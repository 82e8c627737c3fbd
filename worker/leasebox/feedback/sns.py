"""Amazon SES events, delivered by Amazon SNS: signed messages from an allowed topic.

SES publishes its notifications (`notificationType`) or events (`eventType`) to an SNS
topic, and SNS posts each as a JSON message signed with RSA: `SignatureVersion` 1 over the
SHA-1 of a canonical string, 2 over its SHA-256, verified with the certificate at
`SigningCertURL` (`certificates`). The canonical string lists, each name followed by its
value on its own line, `Message`, `MessageId`, `Subject` (when present), `Timestamp`,
`TopicArn` and `Type` for a notification, and `Message`, `MessageId`, `SubscribeURL`,
`Timestamp`, `Token`, `TopicArn` and `Type` for a subscription's confirmation.

A valid signature proves only that SNS sent it: anyone can create a topic and point it at
the receiver. So the `TopicArn` must be one the receiver was given (`topic_arns`), before
any certificate is fetched; a subscription is confirmed only for such a topic.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from leasebox.feedback.certificates import SigningCertificates
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
from leasebox.feedback.signing import Inbound, Refused, forged, unsigned

NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_FIELDS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
# SNS redelivers a message as it was (same time, same signature) for as long as its retry
# policy lasts, so a message is stale only after an hour.
DEFAULT_TOLERANCE_SECONDS = 3600.0
_HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}
# Bounce sub-types that mean SES did not even try: the address is on a suppression list.
_SUPPRESSED_SUBTYPES = ("Suppressed", "OnAccountSuppressionList")


@dataclass(frozen=True)
class SesSettings:
    """The topics the receiver takes messages from, and where their certificates come from."""

    topic_arns: frozenset[str]
    certificates: SigningCertificates = field(default_factory=SigningCertificates)
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS

    def __post_init__(self) -> None:
        if not self.topic_arns:
            raise ValueError("SES through SNS needs at least one allowed topic ARN")


@dataclass(frozen=True)
class SnsMessage:
    """A verified SNS message: its type, its topic's region and the fields."""

    type: str
    region: str
    fields: dict[str, Any]


def verify(inbound: Inbound, settings: SesSettings) -> SnsMessage:
    """The message, if an allowed topic sent it and SNS signed it recently; else `Refused`."""
    fields = json_object(inbound.body, "an SNS body")
    kind = fields.get("Type")
    names = NOTIFICATION_FIELDS if kind == "Notification" else CONFIRMATION_FIELDS
    if kind not in ("Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"):
        raise BadPayload("not an SNS message type")
    topic = fields.get("TopicArn")
    if not isinstance(topic, str) or topic not in settings.topic_arns:
        raise Refused(403, "unknown_topic")
    region = _region(topic)
    version = str(fields.get("SignatureVersion", ""))
    signature, certificate = fields.get("Signature"), fields.get("SigningCertURL")
    if version not in _HASHES or not isinstance(signature, str) or not isinstance(certificate, str):
        raise unsigned()
    stamp = moment(fields.get("Timestamp"))
    if abs((inbound.now - stamp).total_seconds()) > settings.tolerance_seconds:
        raise Refused(400, "stale")
    if any(not isinstance(fields.get(n), str) for n in names if n != "Subject"):
        raise BadPayload("the SNS message lacks a field it signs")
    canonical = "".join(
        f"{name}\n{fields[name]}\n"
        for name in names
        if name in fields and (name != "Subject" or fields[name] is not None)
    )
    try:
        raw = base64.b64decode(signature, validate=True)
    except binascii.Error:
        raise forged() from None
    key = settings.certificates.public_key(certificate, region)
    try:
        key.verify(raw, canonical.encode(), padding.PKCS1v15(), _HASHES[version]())
    except InvalidSignature:
        raise forged() from None
    return SnsMessage(str(kind), region, fields)


def _region(topic: str) -> str:
    parts = topic.split(":")
    if len(parts) < 6 or parts[0] != "arn" or parts[2] != "sns" or not parts[3]:
        raise Refused(403, "unknown_topic")
    return parts[3]


def parse(message: SnsMessage) -> list[FeedbackEvent]:
    """The SES events of a notification (its `Message` is SES's own JSON)."""
    ses = json_object(message.fields["Message"], "the SES event an SNS message carries")
    kind = ses.get("eventType") or ses.get("notificationType")
    mail = ses.get("mail")
    base = {
        "provider_message_id": text_field(mail, "messageId", required=True),
        "sending_domain": sender_domain(path(mail, "source")),
    }
    if kind == "Delivery":
        return [
            FeedbackEvent(
                recipient=address(r),
                type=EventType.DELIVERED,
                occurred_at=moment(path(ses, "delivery", "timestamp")),
                **base,
            )
            for r in _list(path(ses, "delivery", "recipients"))
        ]
    if kind == "Bounce":
        return _bounces(ses, base)
    if kind == "Complaint":
        at = moment(path(ses, "complaint", "timestamp"))
        detail = clean(path(ses, "complaint", "complaintFeedbackType"))
        return [
            FeedbackEvent(
                recipient=address(path(r, "emailAddress")),
                type=EventType.COMPLAINED,
                occurred_at=at,
                detail=detail,
                **base,
            )
            for r in _list(path(ses, "complaint", "complainedRecipients"))
        ]
    if kind == "DeliveryDelay":
        at = moment(path(ses, "deliveryDelay", "timestamp"))
        detail = clean(path(ses, "deliveryDelay", "delayType"))
        return [
            FeedbackEvent(
                recipient=address(path(r, "emailAddress")),
                type=EventType.DEFERRED,
                occurred_at=at,
                smtp_status=smtp_status(path(r, "status")),
                detail=detail,
                **base,
            )
            for r in _list(path(ses, "deliveryDelay", "delayedRecipients"))
        ]
    if kind == "Reject":
        at = moment(path(mail, "timestamp"))
        detail = clean(path(ses, "reject", "reason"))
        return [
            FeedbackEvent(
                recipient=address(r), type=EventType.REJECTED, occurred_at=at, detail=detail, **base
            )
            for r in _list(path(mail, "destination"))
        ]
    return []  # sends, opens, clicks, rendering failures: not about the mailbox


def _bounces(ses: dict[str, Any], base: dict[str, Any]) -> list[FeedbackEvent]:
    bounce = ses.get("bounce")
    at = moment(path(bounce, "timestamp"))
    permanent = path(bounce, "bounceType") == "Permanent"
    subtype = str(path(bounce, "bounceSubType") or "")
    events = []
    for r in _list(path(bounce, "bouncedRecipients")):
        status = smtp_status(path(r, "status"), path(r, "diagnosticCode"))
        detail = clean(path(r, "diagnosticCode")) or clean(subtype)
        if subtype in _SUPPRESSED_SUBTYPES:
            kind, bounce_class = EventType.SUPPRESSED, None
        else:
            kind, bounce_class = (
                EventType.BOUNCED,
                bounce_class_of(status, HARD if permanent else SOFT),
            )
            if permanent:
                bounce_class = HARD
        events.append(
            FeedbackEvent(
                recipient=address(path(r, "emailAddress")),
                type=kind,
                occurred_at=at,
                bounce_class=bounce_class,
                smtp_status=status,
                detail=detail,
                **base,
            )
        )
    return events


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise BadPayload("the SES event names no recipient")
    return value
