"""What a demo run proves: the evidence, the summary, and the verdict, all pure.

The demo gathers evidence from three independent witnesses (the clients' record of what the
API accepted, the outbox rows, and the SMTP sink's record of what arrived) and this module
turns it into a summary and a verdict without any I/O, so that the rules that decide the
exit code are unit-tested on crafted evidence, including evidence of a broken guarantee.

The guarantee checked is the one leasebox states: every accepted send is delivered (or
dead-lettered because the provider rejected it for good), and a duplicate exists only where
a worker was killed or lost its lease while holding that message, at most one extra copy per
such event, always under the first copy's Message-ID. Each duplicate is explained from the
row's attempt history (what `leasebox trace` reads), not from the demo's own notes of whom
it killed: a lease that ran out with its holder never reporting back (the killed worker), or
a send accepted after its worker lost the lease.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from leasebox.demo.sla import SlaAccount, render_sla

CAUSE_KILLED = "worker killed mid-send"
CAUSE_LEASE_LOST = "lease lost"
CAUSE_AMBIGUOUS = "ambiguous send"
CAUSE_UNEXPLAINED = "unexplained"
MAX_DUPLICATES_SHOWN = 5


@dataclass(frozen=True)
class OutboxRow:
    id: int
    status: str
    dead_reason: str | None
    recipient: str
    delivery_key: str
    latency_seconds: float | None


@dataclass(frozen=True)
class Copy:
    """One message the sink accepted."""

    delivery_key: str
    message_id: str


@dataclass(frozen=True)
class Kill:
    """A worker the scenario SIGKILLed, and the rows it held leases on at that moment."""

    worker_id: str
    at_seconds: float
    leased_ids: frozenset[int]


@dataclass(frozen=True)
class HistoryAccount:
    """What a row's attempt history says about the copies the provider may hold.

    sent: sends recorded by the lease holder (one for a sent row); late_accepted: sends
    accepted after their worker had lost the lease (`lease_lost` with a provider message id);
    vanished: workers whose lease ran out and who never reported back (killed); ambiguous:
    attempts whose outcome the provider left unknown; story: the trace's words for it.
    """

    sent: int = 0
    late_accepted: int = 0
    vanished: tuple[str, ...] = ()
    ambiguous: int = 0
    story: str = ""

    @property
    def extra_explained(self) -> int:
        """How many copies beyond the first the history accounts for."""
        return max(0, self.sent + self.late_accepted + len(self.vanished) + self.ambiguous - 1)

    def cause(self, extra: int) -> str:
        """Why `extra` copies beyond the first arrived, or unexplained."""
        if extra > self.extra_explained:
            return CAUSE_UNEXPLAINED
        if self.late_accepted:
            return CAUSE_LEASE_LOST
        if self.vanished:
            return CAUSE_KILLED
        return CAUSE_AMBIGUOUS if self.ambiguous else CAUSE_UNEXPLAINED


@dataclass(frozen=True)
class ScalingEvent:
    at_seconds: float
    previous: int
    replicas: int
    reason: str


@dataclass(frozen=True)
class ApiStats:
    """What the clients saw. `accepted` maps each accepted challenge id to its outbox id."""

    requests: int = 0
    created: int = 0
    replayed: int = 0
    replay_mismatches: int = 0
    errors: int = 0
    checks: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    """Everything a run observed; the input of `summarise`."""

    accepted: Mapping[str, int]
    rows: Sequence[OutboxRow]
    copies: Sequence[Copy]
    kills: Sequence[Kill]
    histories: Mapping[int, HistoryAccount]
    lease_lost_reported: int
    retries: int
    transient_rejections: int
    expected_dead_recipients: frozenset[str]
    api: ApiStats
    scaling: Sequence[ScalingEvent]
    codes_checked: int = 0
    codes_mismatched: int = 0
    wall_seconds: float = 0.0
    scenario: str = ""
    sla: SlaAccount | None = None
    # Addresses that bounced after a send: a later send to them must end suppressed, unsent.
    expected_suppressed_recipients: frozenset[str] = frozenset()
    # How the feedback receiver answered the bounce the demo reported (None: not reported).
    bounce_answer: str | None = None


@dataclass(frozen=True)
class Duplicate:
    outbox_id: int
    copies: int
    message_ids: tuple[str, ...]
    cause: str
    story: str = ""
    vanished: tuple[str, ...] = ()


@dataclass(frozen=True)
class Summary:
    scenario: str
    wall_seconds: float
    api: ApiStats
    logical_sends_accepted: int
    outbox_rows: int
    delivered: int
    copies_received: int
    duplicates: tuple[Duplicate, ...]
    retries: int
    transient_rejections: int
    dead_letters: tuple[tuple[int, str], ...]
    unexpected_dead: tuple[int, ...]
    missing_expected_dead: tuple[str, ...]
    lost: tuple[int, ...]
    unfinished: tuple[int, ...]
    sent_without_copy: tuple[int, ...]
    unknown_copies: int
    latency_p50: float | None
    latency_p99: float | None
    latency_max: float | None
    kills: tuple[Kill, ...]
    lease_lost_reported: int
    scaling: tuple[ScalingEvent, ...]
    codes_checked: int
    codes_mismatched: int
    sla: SlaAccount | None = None
    late_messages: int = 0
    suppressed: tuple[int, ...] = ()
    missing_suppressed: tuple[str, ...] = ()
    bounce_answer: str | None = None

    def duplicates_by_cause(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for duplicate in self.duplicates:
            counts[duplicate.cause] = counts.get(duplicate.cause, 0) + duplicate.copies - 1
        return counts

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["api"]["checks"] = dict(self.api.checks)
        data["kills"] = [
            {"worker_id": k.worker_id, "at_seconds": k.at_seconds, "leased": len(k.leased_ids)}
            for k in self.kills
        ]
        data["duplicates_by_cause"] = self.duplicates_by_cause()
        data["violations"] = verdict(self)
        return data


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def summarise(evidence: Evidence) -> Summary:
    """Fold the evidence into the figures the report shows and the verdict judges."""
    by_key: dict[str, list[Copy]] = {}
    for copy in evidence.copies:
        by_key.setdefault(copy.delivery_key, []).append(copy)
    rows_by_id = {row.id: row for row in evidence.rows}
    delivered_ids = {row.id for row in evidence.rows if row.delivery_key in by_key}
    duplicates: list[Duplicate] = []
    for row in evidence.rows:
        copies = by_key.get(row.delivery_key, [])
        if len(copies) < 2:
            continue
        account = evidence.histories.get(row.id, HistoryAccount())
        message_ids = tuple(dict.fromkeys(c.message_id for c in copies))
        duplicates.append(
            Duplicate(
                row.id,
                len(copies),
                message_ids,
                account.cause(len(copies) - 1),
                account.story,
                account.vanished,
            )
        )
    dead = [(row.id, row.dead_reason or "") for row in evidence.rows if row.status == "dead"]
    expected = evidence.expected_dead_recipients
    unexpected_dead = tuple(
        row.id for row in evidence.rows if row.status == "dead" and row.recipient not in expected
    )
    dead_recipients = {row.recipient for row in evidence.rows if row.status == "dead"}
    missing_dead = tuple(sorted(expected - dead_recipients))
    lost = []
    for outbox_id in sorted(set(evidence.accepted.values())):
        found = rows_by_id.get(outbox_id)
        ok_sent = found is not None and found.status == "sent" and outbox_id in delivered_ids
        ok_dead = found is not None and found.status == "dead" and found.recipient in expected
        ok_suppressed = (
            found is not None
            and found.status == "suppressed"
            and found.recipient in evidence.expected_suppressed_recipients
            and outbox_id not in delivered_ids
        )
        if not (ok_sent or ok_dead or ok_suppressed):
            lost.append(outbox_id)
    suppressed = [r.id for r in evidence.rows if r.status == "suppressed"]
    latencies = [r.latency_seconds for r in evidence.rows if r.latency_seconds is not None]
    known_keys = {row.delivery_key for row in evidence.rows}
    return Summary(
        scenario=evidence.scenario,
        wall_seconds=evidence.wall_seconds,
        api=evidence.api,
        logical_sends_accepted=len(evidence.accepted),
        outbox_rows=len(evidence.rows),
        delivered=len(delivered_ids),
        copies_received=len(evidence.copies),
        duplicates=tuple(duplicates),
        retries=evidence.retries,
        transient_rejections=evidence.transient_rejections,
        dead_letters=tuple(dead),
        unexpected_dead=unexpected_dead,
        missing_expected_dead=missing_dead,
        lost=tuple(lost),
        unfinished=tuple(r.id for r in evidence.rows if r.status in ("pending", "processing")),
        sent_without_copy=tuple(
            r.id for r in evidence.rows if r.status == "sent" and r.id not in delivered_ids
        ),
        unknown_copies=sum(1 for c in evidence.copies if c.delivery_key not in known_keys),
        latency_p50=percentile(latencies, 0.50),
        latency_p99=percentile(latencies, 0.99),
        latency_max=max(latencies) if latencies else None,
        kills=tuple(evidence.kills),
        lease_lost_reported=evidence.lease_lost_reported,
        scaling=tuple(evidence.scaling),
        codes_checked=evidence.codes_checked,
        codes_mismatched=evidence.codes_mismatched,
        sla=evidence.sla,
        late_messages=sum(1 for s in latencies if evidence.sla and s > evidence.sla.sla_seconds),
        suppressed=tuple(suppressed),
        missing_suppressed=tuple(
            sorted(
                evidence.expected_suppressed_recipients
                - {r.recipient for r in evidence.rows if r.id in suppressed}
            )
        ),
        bounce_answer=evidence.bounce_answer,
    )


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:5])
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def verdict(summary: Summary) -> list[str]:
    """Every way the run broke a guarantee, one sentence each; empty when all held."""
    reasons: list[str] = []
    if summary.lost:
        reasons.append(
            f"{len(summary.lost)} accepted send(s) were lost: outbox id(s) {_ids(summary.lost)} "
            "were neither delivered nor dead-lettered by a permanent rejection"
        )
    if summary.unfinished:
        reasons.append(
            f"{len(summary.unfinished)} send(s) were still pending when the run ended: "
            f"outbox id(s) {_ids(summary.unfinished)}"
        )
    if summary.sent_without_copy:
        reasons.append(
            f"{len(summary.sent_without_copy)} row(s) were marked sent but never reached the "
            f"provider: outbox id(s) {_ids(summary.sent_without_copy)}"
        )
    if summary.unexpected_dead:
        reasons.append(
            f"{len(summary.unexpected_dead)} unexpected dead letter(s): outbox id(s) "
            f"{_ids(summary.unexpected_dead)}"
        )
    if summary.missing_expected_dead:
        reasons.append(
            f"{len(summary.missing_expected_dead)} permanently rejected address(es) did not "
            "end as a dead letter"
        )
    unexplained = [d.outbox_id for d in summary.duplicates if d.cause == CAUSE_UNEXPLAINED]
    if unexplained:
        reasons.append(
            f"{len(unexplained)} duplicate(s) without a crash or lease loss in their attempt "
            f"history: outbox id(s) {_ids(unexplained)}"
        )
    mixed = [d.outbox_id for d in summary.duplicates if len(d.message_ids) > 1]
    if mixed:
        reasons.append(
            f"{len(mixed)} duplicate(s) carried a different Message-ID than the first copy: "
            f"outbox id(s) {_ids(mixed)}"
        )
    if summary.unknown_copies:
        reasons.append(f"{summary.unknown_copies} delivered message(s) match no outbox row")
    if summary.api.replay_mismatches:
        reasons.append(
            f"{summary.api.replay_mismatches} retried request(s) got a different challenge "
            "than the first request with the same Idempotency-Key"
        )
    failed_checks = [name for name, ok in summary.api.checks.items() if not ok]
    if failed_checks:
        reasons.append("API check(s) failed: " + "; ".join(failed_checks))
    if summary.missing_suppressed:
        reasons.append(
            f"{len(summary.missing_suppressed)} address(es) bounced and were sent to again "
            "(or never asked for again): no later send to them ended suppressed"
        )
    if summary.codes_mismatched:
        reasons.append(f"{summary.codes_mismatched} delivered code(s) do not match their challenge")
    return reasons


def _n(value: int) -> str:
    return f"{value:,}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def render(summary: Summary) -> str:
    """The human summary table printed at the end of `leasebox demo`."""
    api = summary.api
    by_cause = summary.duplicates_by_cause()
    duplicate_total = sum(by_cause.values())
    lines = [
        f"leasebox demo: {summary.scenario} scenario, {summary.wall_seconds:.1f}s wall time",
        "",
    ]
    checks = "   ".join(f"{name} {'ok' if ok else 'FAILED'}" for name, ok in api.checks.items())
    rows: list[tuple[str, str, str]] = [
        (
            "API requests",
            _n(api.requests),
            f"{_n(api.created)} new challenges, {_n(api.replayed)} retries answered with "
            f"the same challenge, {_n(api.errors)} errors",
        ),
        ("API checks", "", checks),
        (
            "logical sends accepted",
            _n(summary.logical_sends_accepted),
            "challenges the API confirmed; each is one outbox row written in the same transaction",
        ),
        ("emails delivered", _n(summary.delivered), "unique messages the SMTP server accepted"),
        (
            "dead letters",
            _n(len(summary.dead_letters)),
            ", ".join(sorted({reason for _, reason in summary.dead_letters}))
            + (" (the permanently rejected address)" if summary.dead_letters else ""),
        ),
        (
            "suppressed",
            _n(len(summary.suppressed)),
            "the next send to the address that bounced after delivery ended suppressed, "
            f"unsent (the receiver answered the bounce: {summary.bounce_answer or 'not sent'})",
        ),
        (
            "lost",
            _n(len(summary.lost)),
            "accepted but neither delivered, dead-lettered nor suppressed",
        ),
        ("copies received", _n(summary.copies_received), "every accepted SMTP transaction"),
        (
            "duplicates",
            _n(duplicate_total),
            "; ".join(f"{count} from {cause}" for cause, count in by_cause.items()) or "none",
        ),
        (
            "retries",
            _n(summary.retries),
            f"transient failures rescheduled; the server answered {summary.transient_rejections}"
            " times with 451",
        ),
        ("lease losses reported", _n(summary.lease_lost_reported), "by the workers' metrics"),
        (
            "delivery latency",
            "",
            f"p50 {_seconds(summary.latency_p50)}   p99 {_seconds(summary.latency_p99)}   "
            f"max {_seconds(summary.latency_max)} (created to sent)",
        ),
    ]
    if summary.codes_checked:
        rows.append(
            (
                "codes checked",
                _n(summary.codes_checked),
                f"delivered codes verified against the stored hash, "
                f"{summary.codes_mismatched} mismatched",
            )
        )
    width = max(len(label) for label, _, _ in rows)
    for label, value, note in rows:
        lines.append(f"  {label.ljust(width)}  {value.rjust(7)}  {note}".rstrip())
    for kill in summary.kills:
        caused = sum(d.copies - 1 for d in summary.duplicates if kill.worker_id in d.vanished)
        lines.append(
            f"  killed {kill.worker_id} at t={kill.at_seconds:.1f}s holding "
            f"{len(kill.leased_ids)} lease(s): by the attempt history, {caused} of them "
            f"{'was' if caused == 1 else 'were'} taken by the server before the kill and sent "
            "again after the lease ran out, under the same Message-ID"
        )
    if summary.duplicates:
        lines += ["", "Duplicates, from the attempt history (`leasebox trace --id N`)"]
        for duplicate in summary.duplicates[:MAX_DUPLICATES_SHOWN]:
            lines.append(
                f"  outbox id {duplicate.outbox_id}, {duplicate.copies} copies, "
                f"{duplicate.cause}: {duplicate.story or 'no attempt history'}"
            )
        hidden = len(summary.duplicates) - MAX_DUPLICATES_SHOWN
        if hidden > 0:
            lines.append(f"  and {hidden} more")
    lines += ["", "Scaling decisions (the operator's policy on live backlog figures)"]
    for event in summary.scaling:
        lines.append(
            f"  t={event.at_seconds:6.1f}s  {event.previous}→{event.replicas}  {event.reason}"
        )
    if not summary.scaling:
        lines.append("  none")
    if summary.sla is not None:
        lines += render_sla(
            summary.sla,
            late=summary.late_messages,
            delivered=summary.delivered,
            p99=summary.latency_p99,
            worst=summary.latency_max,
        )
    reasons = verdict(summary)
    lines.append("")
    if reasons:
        lines.append("GUARANTEES VIOLATED:")
        lines += [f"  - {reason}" for reason in reasons]
    else:
        lines.append(
            "Guarantees held: every accepted send was delivered, dead-lettered by a permanent "
            "rejection or suppressed after its address bounced, and every duplicate has a "
            "killed worker or a lost lease behind it in its attempt history."
        )
    return "\n".join(lines)
