"""A send's story, folded from its outbox row, its receipts and its attempt history.

When a login code fans out into two messages, two questions matter more than any status
code: did the API create one logical send or two, and did one worker own the send attempt or
did several race it? The history answers both, but as rows; this module pairs them into
attempts (a claim and the event that ended its lease, matched by lease token), attaches what
a worker reported after losing its lease, and counts the copies the provider accepted. It is
pure, so every scenario (a killed worker, a stalled one, an ambiguous drop) is tested on
hand-made events; `narrative` puts the result into words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from leasebox.delivery.providers.base import key_digest, recipient_domain
from leasebox.states import DeadReason, Event
from leasebox.store.history import (
    FeedbackRecord,
    HistoryEvent,
    ReceiptRecord,
    Selector,
    SuppressionRecord,
    TracedRow,
    TraceRecords,
)

# The events that end a lease; `lease_lost` comes from a worker whose lease already ended.
# `superseded` ends one when a worker's check before the wire found the newer message, and
# happens outside any lease (no token) when the producer's transaction replaced it pending.
ENDINGS = frozenset(
    {
        Event.SENT,
        Event.RETRY,
        Event.AMBIGUOUS,
        Event.DEAD,
        Event.SUPPRESSED,
        Event.RELEASED,
        Event.LEASE_EXPIRED,
        Event.SUPERSEDED,
    }
)
IN_FLIGHT = "in_flight"
UNRECORDED = "unrecorded"


class Ownership(StrEnum):
    """The answer to "did one worker own the send attempt, or did several race it?"."""

    NONE = "unclaimed"
    """No attempt is recorded: still waiting, or handled before the history existed."""
    ONE_WORKER = "one_worker"
    """One worker claimed every attempt, and every lease ended in that worker's hands."""
    IN_TURN = "in_turn"
    """Several workers, one after another: each lease ended before the next claim."""
    TAKEN_OVER = "taken_over"
    """A lease ran out and it was reclaimed; the holder never reported back (killed or cut
    off), so whether it sent first is unknown."""
    RACED = "raced"
    """A worker settled after losing its lease: two workers acted on the send at once."""


@dataclass(frozen=True)
class LateReport:
    """What a worker that had lost its lease reported when it settled anyway (`lease_lost`)."""

    at: datetime
    worker_id: str | None
    stalled_seconds: float | None
    provider_message_id: str | None
    error_class: str | None
    error: str | None

    @property
    def accepted(self) -> bool:
        """Its send was accepted: the provider took an extra copy."""
        return self.provider_message_id is not None


@dataclass(frozen=True)
class Attempt:
    """One lease: who claimed it and when, and how and when it ended."""

    number: int | None
    worker_id: str | None
    lease_token: str | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    outcome: str
    ended_at: datetime | None = None
    retry_delay_seconds: float | None = None
    error_class: str | None = None
    error: str | None = None
    dead_reason: str | None = None
    provider_message_id: str | None = None
    superseded_by: int | None = None
    late: LateReport | None = None

    @property
    def held_seconds(self) -> float | None:
        """How long the lease was held: to when it ran out for an expiry, else to its end."""
        end = self.lease_expires_at if self.outcome == Event.LEASE_EXPIRED else self.ended_at
        return _seconds_between(self.claimed_at, end)

    @property
    def vanished(self) -> bool:
        """Its lease ran out and its worker never reported back."""
        return self.outcome == Event.LEASE_EXPIRED and self.late is None


@dataclass(frozen=True)
class Request:
    """The requests behind one receipt: the first, and the retries that reused it."""

    scope: str
    idempotency_key: str
    first_at: datetime
    last_at: datetime
    reuses: int

    @property
    def count(self) -> int:
        return 1 + self.reuses


@dataclass(frozen=True)
class Copies:
    """How many copies the provider accepted, and how many more it may have."""

    accepted: int
    possible: int
    accepted_from: tuple[str, ...] = ()
    possible_from: tuple[str, ...] = ()


@dataclass(frozen=True)
class SendStory:
    """One logical send (one outbox row), told from its history."""

    outbox_id: int
    kind: str
    aggregate_id: str | None
    recipient: str
    delivery_key: str
    message_id: str
    status: str
    dead_reason: str | None
    created_at: datetime
    sent_at: datetime | None
    receipts: tuple[Request, ...]
    attempts: tuple[Attempt, ...]
    events: tuple[HistoryEvent, ...]
    ownership: Ownership
    workers: tuple[str, ...]
    copies: Copies
    replacement_key: str | None = None
    superseded_by: int | None = None
    """The newer message of its replacement key that replaced it (status `superseded`)."""
    # After the send: what the service reported (in the service's order of time), and the
    # suppression-list entry in force for the mailbox.
    feedback: tuple[FeedbackRecord, ...] = ()
    suppression: SuppressionRecord | None = None

    @property
    def requests(self) -> int:
        """Requests that mapped onto this send; a row without a receipt had one, keyless."""
        return sum(r.count for r in self.receipts) or 1

    @property
    def keyless(self) -> bool:
        return not self.receipts


@dataclass(frozen=True)
class Trace:
    """The stories of every send a selector found, newest first for an aggregate."""

    selector: Selector
    sends: tuple[SendStory, ...] = field(default_factory=tuple)

    @property
    def requests(self) -> int:
        return sum(send.requests for send in self.sends)


def mask_recipient(address: str) -> str:
    """`j***@example.com`: enough to tell two recipients apart, not enough to write to."""
    local, at, _ = address.strip().rpartition("@")
    if not at or not local:
        return "***"
    return f"{local[0]}***@{recipient_domain(address.strip())}"


def build_trace(
    records: TraceRecords, selector: Selector, *, show_recipients: bool = False
) -> Trace:
    """The story of each row in `records` (in their order)."""
    sends = tuple(
        build_story(
            row,
            [r for r in records.receipts if r.outbox_id == row.id],
            [e for e in records.events if e.outbox_id == row.id],
            show_recipient=show_recipients,
            feedback=[f for f in records.feedback if f.outbox_id == row.id],
            suppression=next((s for s in records.suppressions if s.outbox_id == row.id), None),
        )
        for row in records.rows
    )
    return Trace(selector, sends)


def _message_id(delivery_key: str, events: Sequence[HistoryEvent]) -> str:
    """The Message-ID an SMTP send of this key wrote, as the history recorded it; its right
    side is the sender's domain, which only a send knows, so before one it is `…`."""
    left = f"<{key_digest(delivery_key)}@"
    for event in events:
        if event.provider_message_id and event.provider_message_id.startswith(left):
            return event.provider_message_id
    return f"{left}…>"


def build_story(
    row: TracedRow,
    receipts: Sequence[ReceiptRecord],
    events: Sequence[HistoryEvent],
    *,
    show_recipient: bool = False,
    feedback: Sequence[FeedbackRecord] = (),
    suppression: SuppressionRecord | None = None,
) -> SendStory:
    """One row's story: its requests, its attempts, who owned them, the copies accepted."""
    ordered = tuple(sorted(events, key=lambda e: e.id))
    attempts = pair_attempts(ordered, row)
    return SendStory(
        outbox_id=row.id,
        kind=row.kind,
        aggregate_id=row.aggregate_id,
        recipient=row.recipient if show_recipient else mask_recipient(row.recipient),
        delivery_key=row.delivery_key,
        message_id=_message_id(row.delivery_key, ordered),
        status=row.status,
        dead_reason=row.dead_reason,
        created_at=row.created_at,
        sent_at=row.sent_at,
        receipts=tuple(
            Request(
                r.scope,
                r.idempotency_key,
                r.created_at,
                r.last_seen_at or r.created_at,
                r.reuse_count,
            )
            for r in receipts
        ),
        attempts=attempts,
        events=ordered,
        ownership=ownership(attempts),
        workers=_workers(attempts),
        copies=count_copies(attempts),
        replacement_key=row.replacement_key,
        superseded_by=row.superseded_by,
        feedback=tuple(feedback),
        suppression=suppression,
    )


def pair_attempts(events: Iterable[HistoryEvent], row: TracedRow) -> tuple[Attempt, ...]:
    """Each claim with the event that ended its lease and any late report, by lease token.

    An ending without its claim (history written partly before it existed) still counts as
    an attempt, with no claim time; a claim with no ending is in flight while the row holds
    that lease, and unrecorded otherwise. Expiry in the queue and requeues are not attempts.
    """
    attempts: list[Attempt] = []
    by_token: dict[str, int] = {}
    for event in events:
        if event.event not in ENDINGS | {Event.CLAIMED, Event.LEASE_LOST}:
            continue
        if event.event == Event.SUPERSEDED and event.lease_token is None:
            continue  # replaced while pending: no attempt
        if event.event == Event.SUPPRESSED and event.lease_token is None:
            continue  # suppressed when claimed: no lease was taken, no attempt made
        token = str(event.lease_token) if event.lease_token is not None else None
        index = by_token.get(token) if token is not None else None
        if event.event == Event.CLAIMED or index is None:
            claimed = event.event == Event.CLAIMED
            attempts.append(
                Attempt(
                    number=event.attempt,
                    worker_id=event.worker_id,
                    lease_token=token,
                    claimed_at=event.at if claimed else None,
                    lease_expires_at=event.lease_expires_at,
                    outcome=UNRECORDED,
                )
            )
            index = len(attempts) - 1
            if token is not None:
                by_token[token] = index
            if claimed:
                continue
        attempts[index] = _settle(attempts[index], event)
    held = str(row.lease_token) if row.status == "processing" and row.lease_token else None
    return tuple(
        replace(a, outcome=IN_FLIGHT)
        if a.outcome == UNRECORDED and held is not None and a.lease_token == held
        else a
        for a in attempts
    )


def _settle(attempt: Attempt, event: HistoryEvent) -> Attempt:
    """`attempt` with what `event` (an ending or a late report) says about it."""
    if event.event == Event.LEASE_LOST:
        late = LateReport(
            at=event.at,
            worker_id=event.worker_id or attempt.worker_id,
            stalled_seconds=_seconds_between(attempt.claimed_at, event.at),
            provider_message_id=event.provider_message_id,
            error_class=event.error_class,
            error=event.error,
        )
        return replace(attempt, late=late)
    if attempt.outcome != UNRECORDED:
        return attempt  # the first ending of a lease is the one that counted
    return replace(
        attempt,
        outcome=Event(event.event).value,
        ended_at=event.at,
        retry_delay_seconds=event.retry_delay_seconds,
        error_class=event.error_class,
        error=event.error,
        dead_reason=event.dead_reason,
        provider_message_id=event.provider_message_id,
        superseded_by=event.superseded_by,
        worker_id=attempt.worker_id or event.worker_id,
        lease_expires_at=event.lease_expires_at or attempt.lease_expires_at,
    )


def ownership(attempts: Sequence[Attempt]) -> Ownership:
    """One worker, several in turn, a lease taken over, or a race."""
    if not attempts:
        return Ownership.NONE
    if any(a.late is not None for a in attempts):
        return Ownership.RACED
    if any(a.vanished for a in attempts):
        return Ownership.TAKEN_OVER
    if len(_workers(attempts)) > 1:
        return Ownership.IN_TURN
    return Ownership.ONE_WORKER


def count_copies(attempts: Sequence[Attempt]) -> Copies:
    """Copies accepted (each `sent`, each late report of an accepted send) and copies the
    provider may have (an ambiguous failure, a last attempt that ended possibly delivered, a
    holder that vanished with its lease)."""
    accepted: list[str] = []
    possible: list[str] = []
    for attempt in attempts:
        who = attempt.worker_id or "a worker"
        if attempt.outcome == Event.SENT:
            accepted.append(f"{who}'s send")
        elif attempt.outcome == Event.AMBIGUOUS or (
            attempt.outcome == Event.DEAD and attempt.dead_reason == DeadReason.POSSIBLY_DELIVERED
        ):
            possible.append(f"{who}'s ambiguous attempt")
        elif attempt.vanished:
            possible.append(f"{who}'s attempt before its lease ran out")
        if attempt.late is not None and attempt.late.accepted:
            accepted.append(f"{attempt.late.worker_id or who}'s send after losing its lease")
    return Copies(len(accepted), len(possible), tuple(accepted), tuple(possible))


def _workers(attempts: Sequence[Attempt]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a.worker_id for a in attempts if a.worker_id))


def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()
