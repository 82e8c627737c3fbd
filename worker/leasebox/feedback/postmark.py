"""Postmark's webhooks: HTTP basic auth on the webhook's URL, one event per request.

Postmark signs nothing; the webhook URL carries a user and password
(`https://user:pass@host/...`), which Postmark sends as basic auth. The receiver takes a
list of credentials, so that one can be rotated without a gap. Events by `RecordType`:
`Delivery`, `Bounce` (its `Type`: `HardBounce`, `SoftBounce`, `Transient`, ...),
`SpamComplaint`, and `SubscriptionChange` with `SuppressSending` (the address went on
Postmark's own list); the others (`Open`, `Click`) are not about delivery.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from leasebox.feedback.events import (
    HARD,
    SOFT,
    EventType,
    FeedbackEvent,
    address,
    clean,
    json_object,
    moment,
    sender_domain,
    smtp_status,
    text_field,
)
from leasebox.feedback.signing import Inbound, Refused, any_equal

# Bounce types by what they mean for the address (Postmark's bounce-type list).
_BOUNCES = {
    "HardBounce": (EventType.BOUNCED, HARD),
    "BadEmailAddress": (EventType.BOUNCED, HARD),
    "SoftBounce": (EventType.BOUNCED, SOFT),
    "DnsError": (EventType.BOUNCED, SOFT),
    "Blocked": (EventType.BOUNCED, SOFT),
    "ContentRelated": (EventType.BOUNCED, SOFT),
    "Transient": (EventType.DEFERRED, None),
    "SpamComplaint": (EventType.COMPLAINED, None),
    "ManuallyDeactivated": (EventType.SUPPRESSED, None),
    "Unsubscribe": (EventType.SUPPRESSED, None),
    "VirusNotification": (EventType.REJECTED, None),
}


@dataclass(frozen=True)
class PostmarkSettings:
    """The user:password pairs the webhook URLs carry (several while one rotates)."""

    credentials: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not self.credentials or not all(
            user and password for user, password in self.credentials
        ):
            raise ValueError("Postmark's webhooks need at least one user:password")


def verify(inbound: Inbound, settings: PostmarkSettings) -> None:
    """Raise `Refused` unless the request carries one of the configured credentials."""
    scheme, _, value = inbound.header("authorization").partition(" ")
    if scheme.lower() != "basic" or not value:
        raise Refused(401, "missing_credentials")
    try:
        given = base64.b64decode(value.strip(), validate=True)
    except binascii.Error:
        raise Refused(401, "bad_credentials") from None
    expected = [f"{user}:{password}".encode() for user, password in settings.credentials]
    if not any_equal(expected, [given]):
        raise Refused(401, "bad_credentials")


def parse(body: bytes) -> list[FeedbackEvent]:
    """The delivery event of one Postmark webhook request (none for other records)."""
    item = json_object(body, "a Postmark body")
    record = item.get("RecordType")
    found: tuple[EventType, str | None] | None
    if record == "Delivery":
        found, recipient, at = (EventType.DELIVERED, None), item.get("Recipient"), "DeliveredAt"
    elif record == "Bounce":
        found, recipient, at = _BOUNCES.get(str(item.get("Type"))), item.get("Email"), "BouncedAt"
    elif record == "SpamComplaint":
        found, recipient, at = (EventType.COMPLAINED, None), item.get("Email"), "BouncedAt"
    elif record == "SubscriptionChange" and item.get("SuppressSending") is True:
        found, recipient, at = (EventType.SUPPRESSED, None), item.get("Recipient"), "ChangedAt"
    else:
        return []
    if found is None:
        return []  # an auto-responder, a challenge: nothing about the mailbox
    kind, bounce = found
    details = clean(item.get("Details")) or clean(item.get("Description"))
    return [
        FeedbackEvent(
            provider_message_id=text_field(item, "MessageID", required=True),
            recipient=address(recipient),
            type=kind,
            occurred_at=moment(item.get(at)),
            bounce_class=bounce,
            smtp_status=smtp_status(item.get("Details"), item.get("Description")),
            detail=details if kind is not EventType.DELIVERED else None,
            sending_domain=sender_domain(item.get("From")),
        )
    ]


def read_credentials(text: str) -> tuple[tuple[str, str], ...]:
    """`user:pass,user2:pass2` as pairs (a password may hold `:`, a user may not)."""
    pairs: list[tuple[str, str]] = []
    for item in (part.strip() for part in text.split(",")):
        user, colon, password = item.partition(":")
        if not colon or not user or not password:
            raise ValueError("Postmark credentials are user:password pairs separated by commas")
        pairs.append((user, password))
    return tuple(pairs)
