"""The story `leasebox trace` tells, built from hand-made history rows for every scenario.

Each test writes the rows the worker would have written for one scenario and checks the two
answers (logical sends and requests; who owned the attempts) and the copies the provider
accepted, in the words and in the JSON.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest

from leasebox.delivery.providers.base import derived_message_id, key_digest
from leasebox.inspection.aftermath import when
from leasebox.inspection.narrative import (
    attempt_line,
    chronicle,
    copies_answer,
    duration,
    ownership_answer,
    render_text,
    requests_answer,
    trace_dict,
)
from leasebox.inspection.trace import (
    IN_FLIGHT,
    UNRECORDED,
    Ownership,
    SendStory,
    Trace,
    build_story,
    build_trace,
    mask_recipient,
)
from leasebox.store.history import (
    HistoryEvent,
    ReceiptRecord,
    Selector,
    TracedRow,
    TraceRecords,
)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
TOKEN_A, TOKEN_B, TOKEN_C = UUID(int=0xA), UUID(int=0xB), UUID(int=0xC)
KEY = "otp:user-1:ch-1"
BY_ID = Selector(outbox_id=1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def row(outbox_id: int = 1, **fields: Any) -> TracedRow:
    values: dict[str, Any] = {
        "id": outbox_id,
        "kind": "otp",
        "aggregate_id": "user-1",
        "recipient": "Jane.Doe@Example.com",
        "delivery_key": KEY if outbox_id == 1 else f"otp:user-1:ch-{outbox_id}",
        "status": "sent",
        "attempts": 1,
        "max_attempts": 8,
        "created_at": T0,
        "sent_at": None,
        "expires_at": None,
        "leased_by": None,
        "lease_token": None,
        "lease_expires_at": None,
        "dead_reason": None,
        "provider_message_id": None,
    }
    values.update(fields)
    return TracedRow(**values)


class History:
    """Rows of one message's history, numbered in the order they are added."""

    def __init__(self, outbox_id: int = 1) -> None:
        self.outbox_id = outbox_id
        self.events: list[HistoryEvent] = []

    def add(self, event: str, seconds: float, **fields: Any) -> History:
        values: dict[str, Any] = {
            "attempt": None,
            "lease_token": None,
            "worker_id": None,
            "lease_expires_at": None,
            "retry_delay_seconds": None,
            "error_class": None,
            "error": None,
            "dead_reason": None,
            "provider_message_id": None,
        }
        values.update(fields)
        self.events.append(
            HistoryEvent(self.outbox_id, len(self.events) + 1, event, at(seconds), **values)
        )
        return self

    def claimed(self, seconds: float, worker: str, token: UUID, attempt: int) -> History:
        return self.add(
            "claimed",
            seconds,
            worker_id=worker,
            lease_token=token,
            attempt=attempt,
            lease_expires_at=at(seconds + 45),
        )

    def ended(self, event: str, seconds: float, worker: str, token: UUID, **fields: Any) -> History:
        return self.add(event, seconds, worker_id=worker, lease_token=token, **fields)


def story(history: History, *receipts: ReceiptRecord, **row_fields: Any) -> SendStory:
    return build_story(row(history.outbox_id, **row_fields), receipts, history.events)


def receipt(key: str, reuses: int, outbox_id: int = 1) -> ReceiptRecord:
    return ReceiptRecord(
        outbox_id, "default", key, T0, at(30) if reuses else None, reuses, at(86400)
    )


def test_the_story_names_the_message_id_an_smtp_send_wrote_on_the_senders_domain() -> None:
    written = derived_message_id(KEY, "example.com")
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended("sent", 0.4, "worker-a", TOKEN_A, attempt=1, provider_message_id=written)
    assert story(history, sent_at=at(0.4)).message_id == written


def test_one_worker_that_sent_it_owned_every_attempt_and_one_copy_was_accepted() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended("sent", 0.4, "worker-a", TOKEN_A, attempt=1, provider_message_id="<m@x>")
    send = story(history, sent_at=at(0.4))
    assert send.ownership == Ownership.ONE_WORKER
    assert (send.copies.accepted, send.copies.possible) == (1, 0)
    assert ownership_answer(send) == "one worker owned every attempt: worker-a"
    assert copies_answer(send) == "the provider accepted 1 copy"
    assert chronicle(send) == "claimed by worker-a, sent by worker-a at 2026-12-01T12:00:00Z"
    assert attempt_line(send.attempts[0]) == (
        "attempt 1: claimed by worker-a at 2026-12-01T12:00:00Z, sent at "
        "2026-12-01T12:00:00Z (0.4 s after the claim)"
    )


def test_a_retry_then_a_send_by_another_worker_is_two_workers_in_turn() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended(
        "retry",
        1,
        "worker-a",
        TOKEN_A,
        attempt=1,
        error_class="smtp_451",
        error="451 try later",
        retry_delay_seconds=2.0,
    )
    history.claimed(4, "worker-b", TOKEN_B, 2)
    history.ended("sent", 5, "worker-b", TOKEN_B, attempt=2, provider_message_id="<m@x>")
    send = story(history, attempts=2)
    assert send.ownership == Ownership.IN_TURN
    assert send.workers == ("worker-a", "worker-b")
    assert [a.outcome for a in send.attempts] == ["retry", "sent"]
    assert "failed transiently at 2026-12-01T12:00:01Z (smtp_451: 451 try later), " in (
        attempt_line(send.attempts[0])
    )
    assert "retried after 2.0 s" in attempt_line(send.attempts[0])
    assert ownership_answer(send).startswith("2 workers in turn (worker-a, worker-b), never two")
    assert "claimed again by worker-b" in chronicle(send)
    assert send.copies.accepted == 1


def test_an_ambiguous_drop_then_a_send_may_have_left_two_copies_under_one_key() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended(
        "ambiguous",
        1,
        "worker-a",
        TOKEN_A,
        attempt=1,
        error_class="ambiguous",
        error="connection lost after DATA",
        retry_delay_seconds=2.0,
    )
    history.claimed(3, "worker-a", TOKEN_B, 2)
    history.ended("sent", 3.5, "worker-a", TOKEN_B, attempt=2, provider_message_id="<m@x>")
    send = story(history, attempts=2)
    assert send.ownership == Ownership.ONE_WORKER
    assert (send.copies.accepted, send.copies.possible) == (1, 1)
    answer = copies_answer(send)
    assert answer.startswith("the provider accepted 1 copy; 1 more may have reached it")
    assert f"all under the same delivery key '{KEY}' (Message-ID <{key_digest(KEY)}@…>)" in (answer)
    assert "the provider may have accepted it" in attempt_line(send.attempts[0])


def killed_worker() -> History:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.add(
        "lease_expired",
        47,
        worker_id="worker-a",
        lease_token=TOKEN_A,
        attempt=1,
        lease_expires_at=at(45),
    )
    history.claimed(48, "worker-b", TOKEN_B, 2)
    history.ended("sent", 48.5, "worker-b", TOKEN_B, attempt=2, provider_message_id="<m@x>")
    return history


def test_a_killed_workers_send_shows_its_lease_running_out_and_the_reclaim() -> None:
    send = story(killed_worker(), attempts=2)
    assert send.ownership == Ownership.TAKEN_OVER
    assert send.attempts[0].outcome == "lease_expired"
    assert send.attempts[0].held_seconds == 45
    assert chronicle(send) == (
        "claimed by worker-a, worker-a's lease ran out at 2026-12-01T12:00:45Z after 45 s, "
        "reclaimed by worker-b, sent by worker-b at 2026-12-01T12:00:48Z"
    )
    assert "worker-a never reported back after its lease ran out" in ownership_answer(send)
    assert (send.copies.accepted, send.copies.possible) == (1, 1)
    assert "worker-a's attempt before its lease ran out" in copies_answer(send)
    assert "reclaimed at 2026-12-01T12:00:47Z; worker-a never reported back" in (
        attempt_line(send.attempts[0])
    )


def test_a_stalled_worker_that_lost_its_lease_raced_the_new_owner_for_two_copies() -> None:
    history = killed_worker().add(
        "lease_lost",
        52,
        worker_id="worker-a",
        lease_token=TOKEN_A,
        attempt=1,
        provider_message_id="<m@x>",
    )
    send = story(history, attempts=2)
    assert send.ownership == Ownership.RACED
    late = send.attempts[0].late
    assert late is not None
    assert late.accepted
    assert late.stalled_seconds == 52
    assert (send.copies.accepted, send.copies.possible) == (2, 0)
    assert copies_answer(send) == (
        f"the provider accepted 2 copies, all under the same delivery key '{KEY}' "
        f"(Message-ID <{key_digest(KEY)}@…>), so a provider that deduplicates by it drops "
        "the extra"
    )
    assert ownership_answer(send) == (
        "2 workers raced it (worker-a, worker-b): worker-a kept sending after its lease ran "
        "out (stalled 52 s)"
    )
    assert chronicle(send).endswith(
        "lease lost by worker-a at 2026-12-01T12:00:52Z (worker stalled 52 s): its send was "
        "accepted too"
    )
    assert (
        "lease lost: worker-a stalled 52 s (from its claim to its report at 2026-12-01T12:00:52Z)"
        in (attempt_line(send.attempts[0]))
    )


def test_a_stalled_worker_whose_late_send_failed_adds_no_copy() -> None:
    history = killed_worker().add(
        "lease_lost",
        60,
        worker_id="worker-a",
        lease_token=TOKEN_A,
        attempt=1,
        error_class="timeout",
        error="the send timed out",
    )
    send = story(history, attempts=2)
    assert send.ownership == Ownership.RACED
    assert (send.copies.accepted, send.copies.possible) == (1, 0)
    assert "its send failed (timeout: the send timed out)" in attempt_line(send.attempts[0])


def test_a_lease_released_on_shutdown_is_handed_on_without_a_copy() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended("released", 2, "worker-a", TOKEN_A, attempt=1)
    send = story(history, status="pending")
    assert send.attempts[0].outcome == "released"
    assert "released unsent at 2026-12-01T12:00:02Z" in attempt_line(send.attempts[0])
    assert copies_answer(send) == "the provider has accepted no copy yet"
    assert chronicle(send) == "claimed by worker-a, released unsent by worker-a"


def test_an_otp_that_expired_in_the_queue_was_never_attempted() -> None:
    history = History().add("expired", 300, dead_reason="expired")
    send = story(history, status="dead", dead_reason="expired", attempts=0)
    assert send.attempts == ()
    assert send.ownership == Ownership.NONE
    assert chronicle(send) == "expired in the queue at 2026-12-01T12:05:00Z"
    assert copies_answer(send) == "the provider has accepted no copy"
    assert "outbox id 1: otp, aggregate user-1, to J***@example.com, dead (expired)" in (
        render_text(Trace(BY_ID, (send,)))
    )


def test_a_permanent_rejection_dead_letters_the_send_with_its_stored_error() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended(
        "dead",
        1,
        "worker-a",
        TOKEN_A,
        attempt=1,
        dead_reason="rejected",
        error_class="smtp_550",
        error="550 no such user",
    )
    send = story(history, status="dead", dead_reason="rejected")
    assert "dead-lettered at 2026-12-01T12:00:01Z (reason rejected; smtp_550: 550 no such" in (
        attempt_line(send.attempts[0])
    )
    assert chronicle(send) == "claimed by worker-a, dead-lettered by worker-a (rejected)"


def test_a_requeued_dead_letter_is_attempted_again() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended("dead", 1, "worker-a", TOKEN_A, attempt=1, dead_reason="rejected")
    history.add("requeued", 600)
    history.claimed(601, "worker-b", TOKEN_B, 1)
    history.ended("sent", 602, "worker-b", TOKEN_B, attempt=1, provider_message_id="<m@x>")
    send = story(history)
    assert len(send.attempts) == 2
    assert "requeued by a person at 2026-12-01T12:10:00Z, claimed again by worker-b" in (
        chronicle(send)
    )
    assert send.copies.accepted == 1


def test_an_attempt_in_flight_holds_the_rows_current_lease() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    send = story(history, status="processing", lease_token=TOKEN_A, leased_by="worker-a")
    assert send.attempts[0].outcome == IN_FLIGHT
    assert "still in flight (lease until 2026-12-01T12:00:45Z)" in attempt_line(send.attempts[0])
    assert chronicle(send) == "claimed by worker-a, still in flight with worker-a"
    assert copies_answer(send) == "the provider has accepted no copy yet"


def test_a_claim_without_an_ending_whose_lease_the_row_no_longer_holds_is_unrecorded() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    send = story(history, status="processing", lease_token=TOKEN_C)
    assert send.attempts[0].outcome == UNRECORDED
    assert attempt_line(send.attempts[0]).endswith("no ending recorded")


def test_three_requests_onto_one_send_are_one_logical_send() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended("sent", 1, "worker-a", TOKEN_A, attempt=1)
    send = story(history, receipt("login-42", 2))
    trace = Trace(Selector(idempotency_key="login-42"), (send,))
    assert send.requests == 3
    assert requests_answer(trace) == "1 logical send from 3 requests"
    text = render_text(trace)
    assert text.startswith(
        "trace of idempotency key 'login-42' in scope 'default': 1 logical send from 3 requests"
    )
    assert (
        "requests: 3 requests with idempotency key 'login-42' in scope 'default', first at "
        "2026-12-01T12:00:00Z, latest at 2026-12-01T12:00:30Z (receipt reused 2 times)"
    ) in text


def test_a_row_without_a_receipt_is_one_request_without_an_idempotency_key() -> None:
    send = story(History(), status="pending", attempts=0)
    trace = Trace(BY_ID, (send,))
    assert requests_answer(trace) == ("1 logical send from 1 request without an idempotency key")
    assert chronicle(send) == "waiting for a worker"
    assert ownership_answer(send) == "no worker has claimed it"


def test_two_logical_sends_for_one_aggregate_are_told_apart() -> None:
    first = History(1).claimed(0, "worker-a", TOKEN_A, 1)
    first.ended("sent", 1, "worker-a", TOKEN_A, attempt=1)
    second = History(2).claimed(10, "worker-b", TOKEN_B, 1)
    second.ended("sent", 11, "worker-b", TOKEN_B, attempt=1)
    records = TraceRecords(
        rows=(row(2), row(1)),
        receipts=(receipt("a", 0, 1), receipt("b", 0, 2)),
        events=tuple(first.events + second.events),
    )
    trace = build_trace(records, Selector(aggregate_id="user-1"))
    assert [s.outbox_id for s in trace.sends] == [2, 1]
    assert [s.workers for s in trace.sends] == [("worker-b",), ("worker-a",)]
    assert requests_answer(trace) == "2 logical sends from 2 requests"
    data = trace_dict(trace)
    assert data["logical_sends"] == 2
    assert [s["requests"]["receipts"][0]["idempotency_key"] for s in data["sends"]] == ["b", "a"]


def test_reclaiming_an_exhausted_message_dead_letters_it_at_the_lease_expiry() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 8)
    history.add(
        "lease_expired",
        50,
        worker_id="worker-a",
        lease_token=TOKEN_A,
        attempt=8,
        lease_expires_at=at(45),
        dead_reason="attempts_exhausted",
    )
    send = story(history, status="dead", dead_reason="attempts_exhausted")
    assert "and dead-lettered (attempts_exhausted)" in attempt_line(send.attempts[0])
    assert "and it was dead-lettered (attempts_exhausted)" in chronicle(send)


def test_an_ending_whose_claim_is_missing_is_still_an_attempt() -> None:
    history = History().ended("sent", 5, "worker-a", TOKEN_A, attempt=3)
    send = story(history)
    assert send.attempts[0].claimed_at is None
    assert attempt_line(send.attempts[0]).startswith(
        "attempt 3 by worker-a (its claim is not in the history), sent at"
    )


def test_the_json_answers_the_same_questions_as_the_words() -> None:
    history = killed_worker().add(
        "lease_lost", 52, worker_id="worker-a", lease_token=TOKEN_A, provider_message_id="<m@x>"
    )
    send = story(history, receipt("k", 1))
    data = json.loads(json.dumps(trace_dict(Trace(BY_ID, (send,)))))
    assert data["selector"] == {"outbox_id": 1}
    assert (data["logical_sends"], data["requests"]) == (1, 2)
    sent = data["sends"][0]
    assert sent["ownership"]["verdict"] == "raced"
    assert sent["ownership"]["workers"] == ["worker-a", "worker-b"]
    assert (sent["copies"]["accepted"], sent["copies"]["possible"]) == (2, 0)
    assert sent["message_id"] == f"<{key_digest(KEY)}@…>"  # no SMTP send recorded one
    assert sent["recipient"] == "J***@example.com"
    assert sent["attempts"][0]["lease_lost"] == {
        "worker_id": "worker-a",
        "at": "2026-12-01T12:00:52Z",
        "stalled_seconds": 52.0,
        "accepted": True,
        "provider_message_id": "<m@x>",
        "error_class": None,
        "error": None,
    }
    assert [e["event"] for e in sent["timeline"]] == [
        "claimed",
        "lease_expired",
        "claimed",
        "sent",
        "lease_lost",
    ]
    assert sent["timeline"][0]["lease_token"] == str(TOKEN_A)


def test_recipients_are_masked_unless_asked_for() -> None:
    records = TraceRecords((row(),), (), ())
    assert build_trace(records, BY_ID).sends[0].recipient == "J***@example.com"
    shown = build_trace(records, BY_ID, show_recipients=True)
    assert shown.sends[0].recipient == "Jane.Doe@Example.com"
    assert "Jane.Doe" not in render_text(build_trace(records, BY_ID))


@pytest.mark.parametrize(
    ("address", "masked"),
    [
        ("ada@example.com", "a***@example.com"),
        (" Bob@Mail.Example.ORG ", "B***@mail.example.org"),
        ("@example.com", "***"),
        ("nobody", "***"),
    ],
)
def test_a_masked_recipient_keeps_only_its_first_letter_and_domain(
    address: str, masked: str
) -> None:
    assert mask_recipient(address) == masked


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0.44, "0.4 s"), (40.4, "40 s"), (185, "3 min 5 s"), (7800, "2 h 10 min"), (None, "?")],
)
def test_durations_are_rounded_for_reading(seconds: float | None, words: str) -> None:
    assert duration(seconds) == words


def test_times_are_utc_iso_to_the_second() -> None:
    moment = datetime(2026, 12, 1, 14, 0, 3, 900000, tzinfo=timezone(timedelta(hours=1)))
    assert when(moment) == "2026-12-01T13:00:03Z"
    assert when(None) == "?"


def test_a_later_ending_of_the_same_lease_does_not_rewrite_the_first() -> None:
    history = History().claimed(0, "worker-a", TOKEN_A, 1)
    history.ended("sent", 1, "worker-a", TOKEN_A)
    history.ended("retry", 2, "worker-a", TOKEN_A, error_class="smtp_451")
    send = story(history)
    assert [a.outcome for a in send.attempts] == ["sent"]
    assert send.attempts[0].ended_at == at(1)


def test_sends_without_receipts_are_counted_as_keyless_requests() -> None:
    records = TraceRecords(rows=(row(2), row(1)), receipts=(receipt("a", 1, 1),), events=())
    trace = build_trace(records, Selector(aggregate_id="user-1"))
    assert requests_answer(trace) == (
        "2 logical sends from 3 requests (1 of the sends from a request without an idempotency key)"
    )
