"""What the pages show, read on the caller's connection: the overview, dead letters, a story.

The overview is the backlog the operator polls (`store.backlog`) for every kind that has
messages, beside the sends and failed attempts of the last minutes from the attempt history
(`sql/web.sql`) and the conditions that would page someone now, worded like the chart's
alerts. Dead letters come from `store.dead_letters` with the filters of the form; a
message's story is `leasebox trace`'s (`store.history`, `inspection`). Nothing here reads a
message's data, secrets or body.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from leasebox.config import duration
from leasebox.db.queries import SqlFile, query
from leasebox.errors import ConfigurationError
from leasebox.inspection.narrative import send_dict
from leasebox.inspection.trace import build_trace
from leasebox.states import DeadReason
from leasebox.store.backlog import fetch_backlog, known_kinds
from leasebox.store.dead_letters import DeadLetter, DeadLetterFilter, list_dead_letters
from leasebox.store.history import Selector, read_trace
from leasebox.web.settings import WebSettings

WEB_SQL = SqlFile("leasebox.web", "web.sql")
PAGE_SIZE = 200
# The failure share of attempts above which the provider looks unhealthy (as the chart's
# LeaseboxRetryRatioHigh alert judges it).
FAILURE_RATIO_ALERT = 0.1
# The dead-letter filter's fields, in the order of the form and of a query string.
FILTER_FIELDS = ("kind", "reason", "error_class", "within", "older_than")


@dataclass(frozen=True)
class KindRow:
    """One kind in the overview."""

    kind: str
    pending: int
    ready: int
    processing: int
    dead: int
    expired_leases: int
    oldest_pending_age_seconds: float
    sla_seconds: float
    sent: int
    failed: int
    failures: tuple[tuple[str, int], ...]

    @property
    def sla_met(self) -> bool:
        return self.oldest_pending_age_seconds <= self.sla_seconds

    @property
    def failure_ratio(self) -> float:
        attempts = self.sent + self.failed
        return self.failed / attempts if attempts else 0.0


@dataclass(frozen=True)
class Overview:
    rows: tuple[KindRow, ...]
    alerts: tuple[str, ...]
    observed_at: datetime | None
    window_seconds: float


def overview(conn: psycopg.Connection[Any], settings: WebSettings) -> Overview:
    """Every kind's backlog against its SLA, its recent sends and failures, and alerts."""
    window = settings.window_seconds
    schema = settings.schema
    params = {"window_seconds": window}
    sent = {
        str(kind): int(count)
        for kind, count in conn.execute(query("recent_sends", schema, WEB_SQL), params)
    }
    failures: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for kind, event, error_class, count in conn.execute(
        query("recent_failures", schema, WEB_SQL), params
    ):
        failures[str(kind)].append((str(event), str(error_class), int(count)))
    kinds = sorted({*known_kinds(conn, schema=schema), *sent, *failures})
    if not kinds:
        return Overview((), (), None, window)
    backlog = fetch_backlog(conn, kinds, schema=schema, window_seconds=window)
    rows = []
    for kind, one in backlog.by_kind().items():
        classes: dict[str, int] = defaultdict(int)
        for event, error_class, count in failures[kind]:
            classes[error_class or event] += count
        rows.append(
            KindRow(
                kind=kind,
                pending=one.pending,
                ready=one.ready,
                processing=one.processing,
                dead=one.dead,
                expired_leases=one.expired_leases,
                oldest_pending_age_seconds=one.oldest_pending_age_seconds,
                sla_seconds=settings.sla_of(kind),
                sent=sent.get(kind, 0),
                failed=sum(classes.values()),
                failures=tuple(sorted(classes.items(), key=lambda c: (-c[1], c[0]))),
            )
        )
    return Overview(tuple(rows), alert_lines(rows, failures, window), backlog.observed_at, window)


def alert_lines(
    rows: list[KindRow], failures: Mapping[str, list[tuple[str, str, int]]], window: float
) -> tuple[str, ...]:
    """One line per condition that holds now, named after the chart's alert where one fits."""
    minutes = f"{window / 60:g} min"
    lines = []
    for row in rows:
        age, sla = row.oldest_pending_age_seconds, row.sla_seconds
        if age > sla:
            lines.append(
                f"LeaseboxVerificationSLABreached: {row.kind}: the oldest pending message is "
                f"{age:.0f} s old, over its SLA of {sla:g} s"
            )
        elif age > sla / 2:
            lines.append(
                f"LeaseboxVerificationSLAAtRisk: {row.kind}: the oldest pending message is "
                f"{age:.0f} s old, more than half its SLA of {sla:g} s"
            )
        dead_now = sum(c for e, _, c in failures.get(row.kind, []) if e == "dead")
        if dead_now:
            lines.append(
                f"LeaseboxDeadLettersIncreasing: {row.kind}: {dead_now} new dead letters in "
                f"the last {minutes} ({row.dead} waiting)"
            )
        if row.failed and row.failure_ratio > FAILURE_RATIO_ALERT:
            top = ", ".join(f"{name} x{count}" for name, count in row.failures[:3])
            lines.append(
                f"LeaseboxRetryRatioHigh: {row.kind}: {row.failure_ratio:.0%} of attempts "
                f"failed in the last {minutes} ({top})"
            )
        reclaimed = sum(c for e, _, c in failures.get(row.kind, []) if e == "lease_expired")
        if reclaimed or row.expired_leases:
            lines.append(
                f"LeaseboxLeasesReclaimed: {row.kind}: {reclaimed} leases reclaimed in the "
                f"last {minutes}, {row.expired_leases} expired now (workers died or stalled)"
            )
    return tuple(lines)


@dataclass(frozen=True)
class DeadLetterQuery:
    """The dead-letter form as given (for the page) and as the store's filter."""

    given: dict[str, str]
    selection: DeadLetterFilter


def dead_letter_query(form: Mapping[str, str], *, limit: int | None = None) -> DeadLetterQuery:
    """The filter a form or query string names; a bad value is a `ConfigurationError`."""
    given = {name: str(form.get(name, "")).strip() for name in FILTER_FIELDS}
    reason = given["reason"] or None
    if reason is not None and reason not in {r.value for r in DeadReason}:
        raise ConfigurationError(f"unknown dead reason {reason!r}")
    kind = given["kind"] or None
    within = _seconds(given["within"], "dead within")
    older = _seconds(given["older_than"], "dead for longer than")
    selection = DeadLetterFilter(
        kinds=(kind,) if kind else None,
        reason=reason,
        error_class=given["error_class"] or None,
        newer_than_seconds=within,
        older_than_seconds=older,
        limit=limit,
    )
    return DeadLetterQuery({k: v for k, v in given.items() if v}, selection)


def _seconds(text: str, what: str) -> float | None:
    if not text:
        return None
    try:
        return duration(text)
    except ValueError:
        raise ConfigurationError(
            f"{what}: {text!r} is no duration; use a number with s, m, h, d or w, e.g. 1h"
        ) from None


@dataclass(frozen=True)
class DeadLetterPage:
    letters: list[DeadLetter]
    kinds: list[str]
    reasons: list[str]
    error_classes: list[str]


def dead_letters(
    conn: psycopg.Connection[Any], chosen: DeadLetterQuery, *, schema: str
) -> DeadLetterPage:
    """The dead letters the filter selects (at most a page) and the filters' choices."""
    row = conn.execute(query("dead_letter_choices", schema, WEB_SQL)).fetchone()
    kinds, reasons, classes = row if row else (None, None, None)
    letters = list_dead_letters(conn, chosen.selection, schema=schema)
    return DeadLetterPage(letters, list(kinds or []), list(reasons or []), list(classes or []))


def message_story(
    conn: psycopg.Connection[Any], outbox_id: int, *, schema: str, show_recipients: bool
) -> dict[str, Any] | None:
    """`leasebox trace --id` of one message as JSON-able values, or None when there is none."""
    selector = Selector(outbox_id=outbox_id)
    records = read_trace(conn, selector, schema=schema)
    if not records.rows:
        return None
    (send,) = build_trace(records, selector, show_recipients=show_recipients).sends
    return send_dict(send)
