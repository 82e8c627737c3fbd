"""What happened after the send, in a line: `sent 12:00:01, delivered 12:00:03`.

A mail service reports on a message after it accepted it (delivered, bounced, a spam
complaint), and the suppression list may hold its mailbox because of it; `leasebox trace`
tells both after the send's own story, from the events and the entry the store read.
"""

from __future__ import annotations

from datetime import UTC, datetime

from leasebox.inspection.trace import SendStory
from leasebox.store.history import FeedbackRecord, SuppressionRecord


def when(moment: datetime | None) -> str:
    """`2026-12-01T12:00:03Z`, or `?` when unknown."""
    if moment is None:
        return "?"
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clock(moment: datetime, day: datetime | None) -> str:
    """`12:00:03` on the day of `day`, the full time otherwise."""
    if day is not None and moment.astimezone(UTC).date() == day.astimezone(UTC).date():
        return moment.astimezone(UTC).strftime("%H:%M:%S")
    return when(moment)


def feedback_phrase(record: FeedbackRecord, day: datetime | None) -> str:
    """`delivered 12:00:03`, `bounced 5.1.1 (hard) 12:00:09`."""
    what = record.event
    if record.event == "bounced":
        status = f" {record.smtp_status}" if record.smtp_status else ""
        what = f"bounced{status} ({record.bounce_class or 'soft'})"
    elif record.event == "suppressed":
        what = f"not sent by {record.provider}: on its suppression list"
    return f"{what} {_clock(record.occurred_at, day)}"


def suppression_phrase(entry: SuppressionRecord) -> str:
    until = f"until {when(entry.expires_at)}" if entry.expires_at else "until lifted"
    detail = f", {entry.detail}" if entry.detail else ""
    return f"address suppressed ({entry.reason}{detail}, since {when(entry.created_at)}, {until})"


def after_send(send: SendStory) -> str | None:
    """What happened after the send, in one line: `sent 12:00:01, delivered 12:00:03`, or
    `sent 12:00:01, bounced 5.1.1 (hard) 12:00:09, address suppressed (...)`; None when
    there is nothing to tell (no feedback, no suppression)."""
    if not send.feedback and send.suppression is None:
        return None
    parts = [f"sent {_clock(send.sent_at, send.sent_at)}"] if send.sent_at else []
    parts += [feedback_phrase(f, send.sent_at) for f in send.feedback]
    if send.suppression is not None:
        parts.append(suppression_phrase(send.suppression))
    return ", ".join(parts)
