"""A histogram observed a batch at a time, exported through prometheus_client's public API.

A worker settles its sends a batch at a time. Observing each latency of a batch through a
`prometheus_client.Histogram` costs a lock per value and bucket; reaching into its buckets to
add a batch at once would tie the worker to private attributes that a release of the
library may change without notice, and silently miscount. So the worker keeps its own
counts: a batch is sorted once, each bucket's share read off by bisection and added under
one lock, and a custom collector (`HistogramMetricFamily`, the documented way to export
numbers a program keeps itself) turns them into the same `_bucket`, `_count` and `_sum`
samples a `Histogram` would write.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric

__all__ = ["BatchHistogram", "HistogramSeries"]


class HistogramSeries:
    """One label set's counts: a value lands in the first bucket whose bound is at least
    the value (the last bucket is +Inf), as Prometheus's `le` says."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._lock = threading.Lock()
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        index = bisect_left(self._bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def observe_many(self, values: Sequence[float]) -> None:
        """The same counts as one `observe` per value, under one lock."""
        if not values:
            return
        ordered = sorted(values)
        shares: list[int] = []
        counted = 0
        for bound in self._bounds:
            upto = bisect_right(ordered, bound, lo=counted)  # the values at most `bound`
            shares.append(upto - counted)
            counted = upto
        shares.append(len(ordered) - counted)
        total = math.fsum(ordered)
        with self._lock:
            for index, share in enumerate(shares):
                self._counts[index] += share
            self._sum += total

    def snapshot(self) -> tuple[list[int], float]:
        """The cumulative bucket counts (last: +Inf, the count) and the sum."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for count in counts:
            running += count
            cumulative.append(running)
        return cumulative, total


class BatchHistogram:
    """A labelled histogram with `labels(...).observe_many(values)`; a registry collector."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(float(b) for b in buckets if not math.isinf(b))
        if any(b >= 1e15 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: bucket bounds must be increasing, distinct and below 1e15")
        self.name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = bounds
        # `le` as prometheus_client writes it ("60.0"): the alert rules match those spellings.
        self._bucket_labels = [*(repr(b) for b in bounds), "+Inf"]
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: str) -> HistogramSeries:
        """The series of one label set, created at zero on first use."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self.name}: expected labels {self._labelnames}, got {values}")
        found = self._series.get(values)
        if found is None:
            with self._lock:
                found = self._series.setdefault(values, HistogramSeries(self._bounds))
        return found

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self._documentation, labels=self._labelnames)
        with self._lock:
            series = list(self._series.items())
        for values, one in series:
            cumulative, total = one.snapshot()
            buckets = list(zip(self._bucket_labels, cumulative, strict=True))
            family.add_metric(list(values), buckets, total)
        yield family
