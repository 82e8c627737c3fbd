"""One vocabulary for what the mail services report after they accepted a message.

Each service names its events its own way (SES `Bounce`/`Permanent`, SendGrid `bounce` of
type `blocked`, Postmark `HardBounce`, Mailgun `failed` with `severity: permanent`, Resend
`email.bounced`); leasebox keeps six, in the spirit of django-anymail's tracking events:

    delivered    the receiving server took the message
    deferred     it refused for now; the service keeps trying
    bounced      it refused for good (`hard`: no such mailbox) or the service gave up
                 (`soft`: full, too large, greylisted too long), with the SMTP status
    complained   the recipient marked it as spam
    rejected     the service would not send it at all (a virus, a policy)
    suppressed   the service did not send it because the address is on its own list

A parser raises `BadPayload` for a body that is not what its service sends; the receiver
answers 400 and stores nothing. Everything an event carries is untrusted: texts are made
one bounded line (`clean`), and nothing of it is logged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from leasebox.addresses import domain_of, mailbox_key

MAX_DETAIL = 200
MAX_ID = 250
_STATUS = re.compile(r"\b([245])\.(\d{1,3})\.(\d{1,3})\b")
_CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff]+")
# The mailbox providers a metric may name: the big ones that publish a sender's spam rate.
MAILBOX_PROVIDERS = {
    "gmail.com": "gmail",
    "googlemail.com": "gmail",
    "yahoo.com": "yahoo",
    "ymail.com": "yahoo",
    "aol.com": "yahoo",
    "outlook.com": "microsoft",
    "hotmail.com": "microsoft",
    "live.com": "microsoft",
    "msn.com": "microsoft",
}


class EventType(StrEnum):
    DELIVERED = "delivered"
    DEFERRED = "deferred"
    BOUNCED = "bounced"
    COMPLAINED = "complained"
    REJECTED = "rejected"
    SUPPRESSED = "suppressed"


HARD = "hard"
SOFT = "soft"


class BadPayload(ValueError):
    """The body is not what the service sends (malformed JSON, a missing field)."""


@dataclass(frozen=True)
class FeedbackEvent:
    """One event about one recipient of one message, in leasebox's words."""

    provider_message_id: str
    recipient: str
    type: EventType
    occurred_at: datetime
    bounce_class: str | None = None
    smtp_status: str | None = None
    detail: str | None = None
    sending_domain: str = ""

    @property
    def recipient_key(self) -> str:
        return mailbox_key(self.recipient)

    @property
    def mailbox_provider(self) -> str:
        """`gmail`, `yahoo`, `microsoft` or `other`: a metric label, never the address."""
        return MAILBOX_PROVIDERS.get(domain_of(self.recipient), "other")

    @property
    def outcome(self) -> str:
        """The event as a metric label: `bounced_hard` and `bounced_soft` apart."""
        if self.type is EventType.BOUNCED:
            return f"bounced_{self.bounce_class or SOFT}"
        return self.type.value

    @property
    def key(self) -> tuple[str, str, str, datetime]:
        """What the event is, as the events table keys it (the provider apart)."""
        return (self.provider_message_id, self.recipient_key, self.type.value, self.occurred_at)


def clean(value: object, limit: int = MAX_DETAIL) -> str | None:
    """A text from a webhook as one bounded, storable line (None when empty)."""
    if value is None:
        return None
    text = _CONTROL.sub(" ", str(value)[: limit * 4]).strip()
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text or None


def smtp_status(*texts: object) -> str | None:
    """The first enhanced status code (`5.1.1`) in the texts, if any."""
    for text in texts:
        if isinstance(text, str | int):
            found = _STATUS.search(str(text))
            if found:
                return ".".join(found.groups())
    return None


def bounce_class_of(status: str | None, default: str) -> str:
    """`hard` for a 5.x.x status, `soft` for 4.x.x, else `default`."""
    if status and status[0] == "5":
        return HARD
    if status and status[0] == "4":
        return SOFT
    return default


def field(source: Any, *path: str) -> Any:
    """`source[path[0]][path[1]]...`, or None when any step is missing or not an object."""
    for name in path:
        if not isinstance(source, dict):
            return None
        source = source.get(name)
    return source


def text_field(source: Any, *path: str, required: bool = False, limit: int = MAX_ID) -> str:
    """A string field, bounded; `BadPayload` when required and missing."""
    value = field(source, *path)
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        if required:
            raise BadPayload(f"the event has no {'.'.join(path)}")
        return ""
    return clean(value, limit) or ""


def address(value: object) -> str:
    """A recipient address as a service gives it (`Ada <ada@x.org>` or `ada@x.org`)."""
    if not isinstance(value, str) or "@" not in value:
        raise BadPayload("the event's recipient is not an address")
    inner = value.rsplit("<", 1)[-1].rstrip(">").strip()
    if not inner or len(inner) > 320 or _CONTROL.search(inner) or " " in inner:
        raise BadPayload("the event's recipient is not an address")
    return inner


def sender_domain(value: object) -> str:
    """The domain of a sender address, if the service names one ('' otherwise)."""
    if not isinstance(value, str) or "@" not in value:
        return ""
    return clean(domain_of(value.rsplit("<", 1)[-1].rstrip(">")), 100) or ""


def moment(value: object) -> datetime:
    """A service's time: ISO 8601 text or Unix seconds, as an aware UTC datetime."""
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(float(value), UTC)
        if isinstance(value, str):
            if re.fullmatch(r"\d+(\.\d+)?", value.strip()):
                return datetime.fromtimestamp(float(value), UTC)
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        pass
    raise BadPayload("the event's time is missing or not a time")


def json_object(body: bytes | str, what: str) -> dict[str, Any]:
    """The body as a JSON object, or `BadPayload` naming `what` it should have been."""
    found = _json(body, what)
    if not isinstance(found, dict):
        raise BadPayload(f"{what} is not a JSON object")
    return found


def json_array(body: bytes, what: str) -> list[Any]:
    """The body as a JSON array, or `BadPayload`."""
    found = _json(body, what)
    if not isinstance(found, list):
        raise BadPayload(f"{what} is not a JSON array")
    return found


def _json(body: bytes | str, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, TypeError):
        raise BadPayload(f"{what} is not JSON") from None
