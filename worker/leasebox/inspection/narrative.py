"""A send's story in plain words, and as a JSON-able dict, for `leasebox trace`.

The words answer the two questions first ("1 logical send from 3 requests"; "2 workers raced
it"), then walk the attempts and the raw timeline. Times are UTC ISO 8601 to the second and
durations are rounded, because a person reads them next to logs. Nothing here can print a
message's data, secrets or body: a story never holds them. The recipient is whatever the
story holds (masked unless the caller asked for it) and errors are the stored ones, which
the worker sanitised and bounded before writing them.
"""

from __future__ import annotations

from typing import Any

from leasebox.inspection.aftermath import after_send, when
from leasebox.inspection.trace import (
    IN_FLIGHT,
    Attempt,
    Copies,
    LateReport,
    Ownership,
    SendStory,
    Trace,
)
from leasebox.states import Event
from leasebox.store.history import HistoryEvent


def duration(seconds: float | None) -> str:
    """`0.4 s`, `40 s`, `3 min 5 s`, `2 h 10 min`, or `?` when unknown."""
    if seconds is None:
        return "?"
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 120:
        return f"{whole} s"
    if whole < 7200:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _plural(count: int, word: str, plural: str = "") -> str:
    return f"{count} {word if count == 1 else plural or word + 's'}"


def _failure(failed: Attempt | HistoryEvent | LateReport) -> str:
    parts = [p for p in (failed.error_class, failed.error) if p]
    return ": ".join(parts) if parts else "no error recorded"


def requests_answer(trace: Trace) -> str:
    """Did the API create one logical send or several, and from how many requests?"""
    sends = len(trace.sends)
    answer = f"{_plural(sends, 'logical send')} from {_plural(trace.requests, 'request')}"
    keyless = sum(1 for send in trace.sends if send.keyless)
    if keyless and sends == 1:
        answer += " without an idempotency key"
    elif keyless:
        answer += f" ({keyless} of the sends from a request without an idempotency key)"
    return answer


def requests_line(send: SendStory) -> str:
    """The requests behind one send, receipt by receipt."""
    if send.keyless:
        return "1 request without an idempotency key (no receipt)"
    parts = []
    for r in send.receipts:
        part = (
            f"{_plural(r.count, 'request')} with idempotency key {r.idempotency_key!r} in scope "
            f"{r.scope!r}, first at {when(r.first_at)}"
        )
        if r.reuses:
            part += f", latest at {when(r.last_at)} (receipt reused {_plural(r.reuses, 'time')})"
        parts.append(part)
    return "; ".join(parts)


def ownership_answer(send: SendStory) -> str:
    """Did one worker own the send attempt, or did several race it?"""
    workers = ", ".join(send.workers)
    count = _plural(len(send.workers), "worker")
    if send.ownership == Ownership.NONE:
        return "no worker has claimed it" + (
            "" if send.status == "pending" else " (no attempt history recorded)"
        )
    if send.ownership == Ownership.ONE_WORKER:
        return f"one worker owned every attempt: {workers}"
    if send.ownership == Ownership.IN_TURN:
        return f"{count} in turn ({workers}), never two at once: each lease ended before the next"
    if send.ownership == Ownership.TAKEN_OVER:
        gone = ", ".join(dict.fromkeys(a.worker_id or "?" for a in send.attempts if a.vanished))
        return (
            f"{count} ({workers}), one lease at a time, but {gone} never reported back after "
            "its lease ran out (killed or cut off): it may have sent before the reclaim"
        )
    racers = [a for a in send.attempts if a.late is not None]
    late = ", ".join(
        f"{a.late.worker_id} kept sending after its lease ran out (stalled "
        f"{duration(a.late.stalled_seconds)})"
        for a in racers
        if a.late is not None
    )
    return f"{count} raced it ({workers}): {late}"


def copies_answer(send: SendStory) -> str:
    """How many copies the provider accepted, and under which key."""
    copies: Copies = send.copies
    if copies.accepted == 0:
        text = "the provider has accepted no copy" + (
            " yet" if send.status in ("pending", "processing") else ""
        )
    else:
        text = f"the provider accepted {_plural(copies.accepted, 'copy', 'copies')}"
    if copies.possible:
        text += (
            f"; {copies.possible} more may have reached it ("
            + "; ".join(copies.possible_from)
            + ")"
        )
    if copies.accepted + copies.possible > 1:
        text += (
            f", all under the same delivery key {send.delivery_key!r} (Message-ID "
            f"{send.message_id}), so a provider that deduplicates by it drops the extra"
        )
    return text


def attempt_line(attempt: Attempt) -> str:
    """`attempt 2: claimed by B at ..., sent at ... (0.3 s after the claim)`."""
    number = f"attempt {attempt.number}" if attempt.number is not None else "an attempt"
    who = attempt.worker_id or "an unknown worker"
    head = (
        f"{number}: claimed by {who} at {when(attempt.claimed_at)}"
        if attempt.claimed_at is not None
        else f"{number} by {who} (its claim is not in the history)"
    )
    ended = when(attempt.ended_at)
    outcome = attempt.outcome
    if outcome == Event.SENT:
        tail = f"sent at {ended} ({duration(attempt.held_seconds)} after the claim)"
    elif outcome == Event.RETRY:
        tail = (
            f"failed transiently at {ended} ({_failure(attempt)}), retried after "
            f"{duration(attempt.retry_delay_seconds)}"
        )
    elif outcome == Event.AMBIGUOUS:
        tail = (
            f"failed ambiguously at {ended} ({_failure(attempt)}): the provider may have "
            f"accepted it; retried after {duration(attempt.retry_delay_seconds)}"
        )
    elif outcome == Event.DEAD:
        tail = f"dead-lettered at {ended} (reason {attempt.dead_reason}; {_failure(attempt)})"
    elif outcome == Event.SUPPRESSED:
        tail = (
            f"refused by the provider at {ended} as an address it suppresses ({_failure(attempt)})"
        )
    elif outcome == Event.RELEASED:
        tail = f"released unsent at {ended} (shutdown, or its lease ran out before the send)"
    elif outcome == Event.SUPERSEDED:
        tail = (
            f"superseded at {ended} by outbox id {attempt.superseded_by}, a newer message of "
            "its replacement key committed before it reached the wire: not sent"
        )
    elif outcome == Event.LEASE_EXPIRED:
        tail = (
            f"its lease ran out at {when(attempt.lease_expires_at)} after "
            f"{duration(attempt.held_seconds)} held by {who}, and it was reclaimed at {ended}"
        )
        if attempt.dead_reason:
            tail += f" and dead-lettered ({attempt.dead_reason})"
        if attempt.late is None:
            tail += f"; {who} never reported back (killed or cut off)"
    elif outcome == IN_FLIGHT:
        tail = f"still in flight (lease until {when(attempt.lease_expires_at)})"
    else:
        tail = "no ending recorded"
    line = f"{head}, {tail}"
    if attempt.late is not None:
        late = attempt.late
        result = (
            f"its send had been accepted (provider message id {late.provider_message_id}): an "
            "extra copy"
            if late.accepted
            else f"its send failed ({_failure(late)})"
            if late.error_class or late.error
            else "it gave the lease back unsent"
        )
        line += (
            f"; lease lost: {late.worker_id} stalled {duration(late.stalled_seconds)} (from its "
            f"claim to its report at {when(late.at)}): {result}"
        )
    return line


def event_line(event: HistoryEvent) -> str:
    """One history row as a timeline line."""
    what = event.event
    who = event.worker_id or "?"
    attempt = f"attempt {event.attempt}" if event.attempt is not None else "attempt ?"
    details = {
        Event.CLAIMED: f"{attempt} by {who}, lease until {when(event.lease_expires_at)}",
        Event.SENT: f"{attempt} by {who}, provider message id {event.provider_message_id}",
        Event.RETRY: f"{attempt} by {who}, {_failure(event)}, retry after "
        f"{duration(event.retry_delay_seconds)}",
        Event.AMBIGUOUS: f"{attempt} by {who}, {_failure(event)}, retry after "
        f"{duration(event.retry_delay_seconds)}",
        Event.DEAD: f"{attempt} by {who}, reason {event.dead_reason}, {_failure(event)}",
        Event.SUPPRESSED: f"{attempt} by {who}, {_suppressed(event)}",
        Event.RELEASED: f"{attempt} by {who}, given back unsent",
        Event.LEASE_EXPIRED: f"{attempt} held by {who}, ran out at "
        f"{when(event.lease_expires_at)}"
        + (f", dead-lettered ({event.dead_reason})" if event.dead_reason else ""),
        Event.LEASE_LOST: f"{attempt} by {who}, settled after losing its lease: "
        + (
            f"accepted, provider message id {event.provider_message_id}"
            if event.provider_message_id
            else _failure(event)
        ),
        Event.EXPIRED: "expired while waiting, dead-lettered (expired)",
        Event.REQUEUED: "a dead letter made pending again by a person",
        Event.SUPERSEDED: f"by outbox id {event.superseded_by}, "
        + (f"{attempt} by {who}, before the wire" if event.lease_token else "while pending"),
    }
    return f"{when(event.at)}  {what:<13}  {details.get(Event(what), '')}".rstrip()


def _suppressed(event: HistoryEvent) -> str:
    if event.lease_token is None:
        return f"not sent: the address is on the suppression list ({event.error})"
    return f"refused by the provider as an address it suppresses ({_failure(event)})"


def chronicle(send: SendStory) -> str:
    """The send's life in one sentence, in order: who claimed it, how each lease ended."""
    by_token = {a.lease_token: a for a in send.attempts if a.lease_token is not None}
    phrases: list[str] = []
    previous = ""
    for event in send.events:
        who = event.worker_id or "a worker"
        attempt = by_token.get(str(event.lease_token)) if event.lease_token else None
        what = event.event
        if what == Event.CLAIMED:
            verb = (
                "claimed"
                if not previous
                else "reclaimed"
                if previous == Event.LEASE_EXPIRED
                else "claimed again"
            )
            phrases.append(f"{verb} by {who}")
        elif what == Event.SENT:
            phrases.append(f"sent by {who} at {when(event.at)}")
        elif what == Event.RETRY:
            phrases.append(
                f"{who}'s send failed transiently ({event.error_class or 'no class'}), retry "
                f"after {duration(event.retry_delay_seconds)}"
            )
        elif what == Event.AMBIGUOUS:
            phrases.append(
                f"{who}'s send ended ambiguously ({event.error_class or 'no class'}: the "
                "provider may have taken it)"
            )
        elif what == Event.DEAD:
            phrases.append(f"dead-lettered by {who} ({event.dead_reason})")
        elif what == Event.SUPPRESSED:
            phrases.append(f"{_suppressed(event)} ({who})")
        elif what == Event.RELEASED:
            phrases.append(f"released unsent by {who}")
        elif what == Event.LEASE_EXPIRED:
            held = duration(attempt.held_seconds) if attempt else "?"
            phrase = f"{who}'s lease ran out at {when(event.lease_expires_at)} after {held}"
            if event.dead_reason:
                phrase += f" and it was dead-lettered ({event.dead_reason})"
            phrases.append(phrase)
        elif what == Event.LEASE_LOST:
            late = attempt.late if attempt else None
            stalled = duration(late.stalled_seconds) if late else "?"
            result = (
                "its send was accepted too"
                if event.provider_message_id
                else "its send failed"
                if event.error_class or event.error
                else "it had not sent"
            )
            phrases.append(
                f"lease lost by {who} at {when(event.at)} (worker stalled {stalled}): {result}"
            )
        elif what == Event.EXPIRED:
            phrases.append(f"expired in the queue at {when(event.at)}")
        elif what == Event.REQUEUED:
            phrases.append(f"requeued by a person at {when(event.at)}")
        elif what == Event.SUPERSEDED:
            where = f"before {who} wrote it to the wire" if event.lease_token else "while pending"
            phrases.append(
                f"superseded by outbox id {event.superseded_by} at {when(event.at)} {where}"
            )
        if what != Event.LEASE_LOST:
            previous = what
    in_flight = [a for a in send.attempts if a.outcome == IN_FLIGHT]
    if in_flight:
        phrases.append(f"still in flight with {in_flight[-1].worker_id or 'a worker'}")
    if not phrases:
        phrases.append(
            "waiting for a worker" if send.status == "pending" else "no attempt history recorded"
        )
    return ", ".join(phrases)


def render_text(trace: Trace) -> str:
    """The whole trace for a terminal."""
    lines = [f"trace of {trace.selector.describe()}: {requests_answer(trace)}"]
    for send in trace.sends:
        aggregate = f", aggregate {send.aggregate_id}" if send.aggregate_id else ""
        status = send.status + (f" ({send.dead_reason})" if send.dead_reason else "")
        if send.superseded_by is not None:
            status += f" by outbox id {send.superseded_by} (replacement key {send.replacement_key})"
        lines += [
            "",
            f"outbox id {send.outbox_id}: {send.kind}{aggregate}, to {send.recipient}, {status}",
            f"  delivery key {send.delivery_key}  Message-ID {send.message_id}",
            f"  created at {when(send.created_at)}"
            + (f", sent at {when(send.sent_at)}" if send.sent_at else ""),
            f"  requests: {requests_line(send)}",
            f"  what happened: {chronicle(send)}",
            *([f"  after the send: {after}"] if (after := after_send(send)) else []),
            f"  ownership: {ownership_answer(send)}",
            f"  copies: {copies_answer(send)}",
            "  attempts:" if send.attempts else "  attempts: none recorded",
        ]
        lines += [f"    {attempt_line(a)}" for a in send.attempts]
        if send.events:
            lines.append("  timeline:")
            lines += [f"    {event_line(e)}" for e in send.events]
    return "\n".join(lines)


def trace_dict(trace: Trace) -> dict[str, Any]:
    """The whole trace as JSON-able values: the answers, then every send in detail."""
    return {
        "selector": trace.selector.as_dict(),
        "logical_sends": len(trace.sends),
        "requests": trace.requests,
        "answer": requests_answer(trace),
        "sends": [send_dict(send) for send in trace.sends],
    }


def send_dict(send: SendStory) -> dict[str, Any]:
    return {
        "outbox_id": send.outbox_id,
        "kind": send.kind,
        "aggregate_id": send.aggregate_id,
        "recipient": send.recipient,
        "delivery_key": send.delivery_key,
        "message_id": send.message_id,
        "status": send.status,
        "dead_reason": send.dead_reason,
        "replacement_key": send.replacement_key,
        "superseded_by": send.superseded_by,
        "created_at": when(send.created_at),
        "sent_at": when(send.sent_at) if send.sent_at else None,
        "requests": {
            "count": send.requests,
            "without_idempotency_key": send.keyless,
            "receipts": [
                {
                    "scope": r.scope,
                    "idempotency_key": r.idempotency_key,
                    "requests": r.count,
                    "first_at": when(r.first_at),
                    "last_at": when(r.last_at),
                }
                for r in send.receipts
            ],
        },
        "story": chronicle(send),
        "ownership": {
            "verdict": send.ownership.value,
            "workers": list(send.workers),
            "answer": ownership_answer(send),
        },
        "copies": {
            "accepted": send.copies.accepted,
            "possible": send.copies.possible,
            "accepted_from": list(send.copies.accepted_from),
            "possible_from": list(send.copies.possible_from),
            "answer": copies_answer(send),
        },
        "attempts": [attempt_dict(a) for a in send.attempts],
        "timeline": [event_dict(e) for e in send.events],
        "after_send": after_send(send),
        "feedback": [
            {
                "provider": f.provider,
                "event": f.event,
                "bounce_class": f.bounce_class,
                "smtp_status": f.smtp_status,
                "detail": f.detail,
                "at": when(f.occurred_at),
            }
            for f in send.feedback
        ],
        "suppression": None
        if send.suppression is None
        else {
            "reason": send.suppression.reason,
            "detail": send.suppression.detail,
            "since": when(send.suppression.created_at),
            "until": when(send.suppression.expires_at) if send.suppression.expires_at else None,
        },
    }


def attempt_dict(attempt: Attempt) -> dict[str, Any]:
    late = attempt.late
    return {
        "attempt": attempt.number,
        "worker_id": attempt.worker_id,
        "lease_token": attempt.lease_token,
        "claimed_at": when(attempt.claimed_at) if attempt.claimed_at else None,
        "outcome": attempt.outcome,
        "ended_at": when(attempt.ended_at) if attempt.ended_at else None,
        "held_seconds": _rounded(attempt.held_seconds),
        "lease_expires_at": when(attempt.lease_expires_at) if attempt.lease_expires_at else None,
        "retry_delay_seconds": _rounded(attempt.retry_delay_seconds),
        "error_class": attempt.error_class,
        "error": attempt.error,
        "dead_reason": attempt.dead_reason,
        "provider_message_id": attempt.provider_message_id,
        "superseded_by": attempt.superseded_by,
        "lease_lost": None
        if late is None
        else {
            "worker_id": late.worker_id,
            "at": when(late.at),
            "stalled_seconds": _rounded(late.stalled_seconds),
            "accepted": late.accepted,
            "provider_message_id": late.provider_message_id,
            "error_class": late.error_class,
            "error": late.error,
        },
        "story": attempt_line(attempt),
    }


def event_dict(event: HistoryEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "event": event.event,
        "at": when(event.at),
        "attempt": event.attempt,
        "worker_id": event.worker_id,
        "lease_token": str(event.lease_token) if event.lease_token else None,
        "lease_expires_at": when(event.lease_expires_at) if event.lease_expires_at else None,
        "retry_delay_seconds": _rounded(event.retry_delay_seconds),
        "error_class": event.error_class,
        "error": event.error,
        "dead_reason": event.dead_reason,
        "provider_message_id": event.provider_message_id,
        "superseded_by": event.superseded_by,
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)
