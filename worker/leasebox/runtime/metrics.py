"""Every metric a worker process exports, in one place, with the names the alerts use.

Each process builds its own `CollectorRegistry` (never the global one), so tests run several
workers in one interpreter without collisions, and `/metrics` shows exactly these series.
Labels are low-cardinality on purpose: kinds, dead-letter reasons and short error codes;
never a recipient, an id or anything from a message.

The delivery-latency buckets are part of the alerting contract: the SLO alert rules read the
60-second bucket (exposed as `le="60.0"`), so the boundaries below change only together with
the chart's rules. Series for the worker's kinds exist from zero (`start_series`) so that the
first dead letter or lost lease already shows up in `increase()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from leasebox.states import DeadReason
from leasebox.version import __version__

DELIVERY_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600)
SEND_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

METRIC_NAMES = (
    "leasebox_claimed_total",
    "leasebox_sent_total",
    "leasebox_retries_total",
    "leasebox_dead_letters_total",
    "leasebox_lease_lost_total",
    "leasebox_leases_reclaimed_total",
    "leasebox_send_duration_seconds",
    "leasebox_delivery_latency_seconds",
    "leasebox_inflight_sends",
    "leasebox_build_info",
)


@dataclass(frozen=True)
class KindSeries:
    """The per-kind children of the hot-path metrics, resolved once (labels() is not free)."""

    claimed: Any
    sent: Any
    lease_lost: Any
    leases_reclaimed: Any
    send_duration: Any
    delivery_latency: Any


class WorkerMetrics:
    """The worker's metrics on a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.claimed = Counter(
            "leasebox_claimed_total", "Rows claimed under a lease.", ["kind"], registry=r
        )
        self.sent = Counter(
            "leasebox_sent_total",
            "Messages the provider accepted and that were marked sent under their lease.",
            ["kind"],
            registry=r,
        )
        self.retries = Counter(
            "leasebox_retries_total",
            "Transient failures scheduled for another attempt, by error code.",
            ["kind", "error_class"],
            registry=r,
        )
        self.dead_letters = Counter(
            "leasebox_dead_letters_total",
            "Messages moved to the dead-letter state, by reason.",
            ["kind", "reason"],
            registry=r,
        )
        self.lease_lost = Counter(
            "leasebox_lease_lost_total",
            "Settling statements that found the lease gone (another worker owns the row).",
            ["kind"],
            registry=r,
        )
        self.leases_reclaimed = Counter(
            "leasebox_leases_reclaimed_total",
            "Expired leases of other (dead or stalled) workers taken back by this worker.",
            ["kind"],
            registry=r,
        )
        self.send_duration = Histogram(
            "leasebox_send_duration_seconds",
            "Time spent in the provider's send, successful or not.",
            ["kind"],
            buckets=SEND_DURATION_BUCKETS,
            registry=r,
        )
        self.delivery_latency = Histogram(
            "leasebox_delivery_latency_seconds",
            "Time from the outbox row's creation to it being marked sent (the SLO source).",
            ["kind"],
            buckets=DELIVERY_LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "leasebox_inflight_sends", "Sends currently waiting on the provider.", registry=r
        )
        # The version and the process metrics, in this registry as in the operator's.
        build = Gauge(
            "leasebox_build_info",
            "Always 1; the labels name the running version",
            ("version", "component"),
            registry=r,
        )
        build.labels(__version__, "worker").set(1)
        ProcessCollector(registry=r)
        r.register(PLATFORM_COLLECTOR)
        r.register(GC_COLLECTOR)
        self._kinds: dict[str, KindSeries] = {}

    def kind(self, kind: str) -> KindSeries:
        """The hot-path series of one kind (created at zero on first use)."""
        found = self._kinds.get(kind)
        if found is None:
            found = self._kinds[kind] = KindSeries(
                claimed=self.claimed.labels(kind),
                sent=self.sent.labels(kind),
                lease_lost=self.lease_lost.labels(kind),
                leases_reclaimed=self.leases_reclaimed.labels(kind),
                send_duration=self.send_duration.labels(kind),
                delivery_latency=self.delivery_latency.labels(kind),
            )
        return found

    def start_series(self, kinds: Iterable[str]) -> None:
        """Create every per-kind series at zero before the first event."""
        for kind in kinds:
            self.kind(kind)
            for reason in DeadReason:
                self.dead_letters.labels(kind, reason)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The current value of one sample (0 when absent); for tests and summaries."""
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found
