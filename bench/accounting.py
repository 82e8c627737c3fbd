"""Exactly-once accounting and the arithmetic of rates: pure functions, tested directly.

Every drain must process every row exactly once, or its rate means nothing. Systems that
keep a row per message (leasebox, the plain baseline) are checked in their table; the
others record the payload number of each job they ran, and the records are checked here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Accounting:
    """What a drain did with `expected` messages numbered 0..expected-1."""

    expected: int
    processed: int
    missing: int
    duplicates: int
    unexpected: int = 0
    note: str = ""

    @property
    def exactly_once(self) -> bool:
        return (
            self.processed == self.expected
            and self.missing == 0
            and self.duplicates == 0
            and self.unexpected == 0
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "expected": self.expected,
            "processed": self.processed,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "unexpected": self.unexpected,
            "exactly_once": self.exactly_once,
            "note": self.note,
        }


def account_ids(expected: int, seen: Iterable[int], note: str = "") -> Accounting:
    """Accounting from the payload numbers of every job run, across all processes."""
    counts = Counter(seen)
    in_range = {i: c for i, c in counts.items() if 0 <= i < expected}
    return Accounting(
        expected=expected,
        processed=sum(counts.values()),
        missing=expected - len(in_range),
        duplicates=sum(c - 1 for c in in_range.values()),
        unexpected=sum(c for i, c in counts.items() if not 0 <= i < expected),
        note=note,
    )


def account_table(
    expected: int, total: int, sent_claimed_once: int, claimed_more: int, note: str = ""
) -> Accounting:
    """Accounting from a leasebox outbox table, where attempts are counted at claim."""
    return Accounting(
        expected=expected,
        processed=sent_claimed_once + claimed_more,
        missing=expected - sent_claimed_once - claimed_more,
        duplicates=claimed_more,
        unexpected=max(total - expected, 0),
        note=note,
    )


def combine(first: Accounting, second: Accounting) -> Accounting:
    """Two independent views of one drain (job records and the peer's own table): both must
    hold, so the worse figure of each kind wins."""
    notes = "; ".join(n for n in (first.note, second.note) if n)
    return Accounting(
        expected=first.expected,
        processed=first.processed,
        missing=max(first.missing, second.missing),
        duplicates=max(first.duplicates, second.duplicates),
        unexpected=max(first.unexpected, second.unexpected),
        note=notes,
    )


def net_rate(rows: int, wall_seconds: float, idle_seconds: float) -> float:
    """Rows per second once start-up and exit (measured on an empty queue) are taken out.

    The idle run is never allowed to eat more than half of the wall time: a drain that short
    is mostly noise, and its gross rate is the honest figure.
    """
    if rows <= 0 or wall_seconds <= 0:
        return 0.0
    busy = max(wall_seconds - idle_seconds, wall_seconds / 2)
    return rows / busy


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def percentile(values: list[float], fraction: float) -> float:
    """The `fraction` quantile by linear interpolation (values need not be sorted)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def per_message_micros(cpu_seconds: float, idle_cpu_seconds: float, rows: int) -> float | None:
    """CPU microseconds per message once the empty-queue run's CPU is taken out."""
    if rows <= 0:
        return None
    return max(cpu_seconds - idle_cpu_seconds, 0.0) / rows * 1_000_000
