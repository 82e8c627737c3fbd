"""Every metric a worker process exports, in one place, with the names the alerts use.

Each process builds its own `CollectorRegistry` (never the global one), so tests run several
workers in one interpreter without collisions, and `/metrics` shows exactly these series.
Labels are low-cardinality on purpose: kinds, dead-letter reasons and short error codes;
never a recipient, an id or anything from a message.

The delivery-latency buckets are part of the alerting contract: the SLO alert rules read the
60-second bucket (exposed as `le="60.0"`), so the boundaries below change only together with
the chart's rules. Series for the worker's kinds exist from zero (`start_series`) so that the
first dead letter or lost lease already shows up in `increase()`.

The hot path counts per batch, not per message: a claim adds its rows to `claimed` at once,
a settled batch adds its rows to `sent` and observes their latencies together
(`BatchHistogram`, one lock per batch instead of one per message and bucket), and the time of
each send is queued (`record_send`) and observed in bulk when the next batch is settled or
whenever the registry is read (a collector registered first folds the queue in), so that no
reader ever sees a total that misses a send already made. The in-flight gauge reads a plain
counter (`sending`) when scraped.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from leasebox.runtime.batch_histogram import BatchHistogram
from leasebox.states import DeadReason
from leasebox.version import __version__

DELIVERY_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600)
SEND_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

METRIC_NAMES = (
    "leasebox_claimed_total",
    "leasebox_sent_total",
    "leasebox_retries_total",
    "leasebox_dead_letters_total",
    "leasebox_superseded_total",
    "leasebox_suppressed_total",
    "leasebox_lease_lost_total",
    "leasebox_leases_reclaimed_total",
    "leasebox_send_duration_seconds",
    "leasebox_delivery_latency_seconds",
    "leasebox_inflight_sends",
    "leasebox_build_info",
    "leasebox_provider_requests_total",
    "leasebox_provider_request_duration_seconds",
    "leasebox_provider_info",
    "leasebox_not_ready",
)
# Why a worker may be not ready on its own account (the `cause` label of `leasebox_not_ready`):
# its provider has not started yet, or messages have encrypted secrets and it has no keys.
NOT_READY_CAUSES = ("provider_start", "payload_keys")
# The `source` of a message suppressed when claimed (the provider's code when it refused it).
SUPPRESSION_LIST = "suppression_list"
# The `outcome` label of the provider metrics (`delivery.providers.base.RequestOutcome`),
# listed here so that this module needs nothing from delivery.
PROVIDER_OUTCOMES = (
    "accepted",
    "rejected",
    "throttled",
    "unavailable",
    "timeout",
    "connection",
    "account",
    "error",
)


class _Pending:
    """A collector with no metrics of its own, registered first: it folds the queued send
    times into their histograms before any other collector of the registry is read."""

    def __init__(self, flush: Any) -> None:
        self._flush = flush

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self._flush()
        return iter(())


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
        # Send times waiting to be observed: (kind, provider, outcome or None, seconds). A deque,
        # because the scrape thread empties it while the event loop appends.
        self._sends: deque[tuple[str, str, str | None, float]] = deque()
        r.register(_Pending(self.flush))
        # Sends waiting on the provider, read by the gauge when it is scraped.
        self.sending = 0
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
        self.superseded = Counter(
            "leasebox_superseded_total",
            "Claimed messages that a newer message of their replacement key replaced before "
            "they reached the wire (ended superseded, not sent).",
            ["kind"],
            registry=r,
        )
        self.suppressed = Counter(
            "leasebox_suppressed_total",
            "Messages not sent because their address is suppressed: found on the suppression "
            "list when claimed (source suppression_list) or refused by the provider as one it "
            "suppresses (source: the provider's code).",
            ["kind", "source"],
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
        self.send_duration = BatchHistogram(
            "leasebox_send_duration_seconds",
            "Time spent in the provider's send, successful or not.",
            ["kind"],
            buckets=SEND_DURATION_BUCKETS,
            registry=r,
        )
        self.delivery_latency = BatchHistogram(
            "leasebox_delivery_latency_seconds",
            "Time from the outbox row's creation to it being marked sent (the SLO source).",
            ["kind"],
            buckets=DELIVERY_LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "leasebox_inflight_sends", "Sends currently waiting on the provider.", registry=r
        )
        self.inflight.set_function(lambda: self.sending)
        self.provider_requests = Counter(
            "leasebox_provider_requests_total",
            "Requests to the mail provider, by what they amounted to (accepted, rejected, "
            "throttled, unavailable, timeout, connection, account, error).",
            ["provider", "outcome"],
            registry=r,
        )
        self.provider_duration = BatchHistogram(
            "leasebox_provider_request_duration_seconds",
            "Time one provider request took, by provider and outcome.",
            ["provider", "outcome"],
            buckets=SEND_DURATION_BUCKETS,
            registry=r,
        )
        self.provider_info = Gauge(
            "leasebox_provider_info",
            "The provider this worker sends through (1), and whether its service drops a "
            "repeated send with the same delivery key (true, false or unknown).",
            ["provider", "idempotent"],
            registry=r,
        )
        self.not_ready = Gauge(
            "leasebox_not_ready",
            "1 while the worker is not ready for this cause (its provider has not started; "
            "messages have encrypted secrets and it has no keys), else 0.",
            ["cause"],
            registry=r,
        )
        for cause in NOT_READY_CAUSES:
            self.not_ready.labels(cause).set(0)
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
        self._provider_series: dict[tuple[str, str], tuple[Any, Any]] = {}

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
            self.superseded.labels(kind)
            for reason in DeadReason:
                self.dead_letters.labels(kind, reason)
            self.suppressed.labels(kind, SUPPRESSION_LIST)

    def start_provider(self, provider: str, idempotent: str) -> None:
        """Describe the provider and create its outcome series at zero."""
        self.provider_info.labels(provider, idempotent).set(1)
        for outcome in PROVIDER_OUTCOMES:
            self.provider_requests.labels(provider, outcome)
            self.provider_duration.labels(provider, outcome)

    def provider_request(self, provider: str, outcome: str, seconds: float) -> None:
        """Count one provider request and its duration."""
        requests, duration = self._provider(provider, outcome)
        requests.inc()
        duration.observe(seconds)

    def _provider(self, provider: str, outcome: str) -> tuple[Any, Any]:
        found = self._provider_series.get((provider, outcome))
        if found is None:
            found = self._provider_series[(provider, outcome)] = (
                self.provider_requests.labels(provider, outcome),
                self.provider_duration.labels(provider, outcome),
            )
        return found

    def claimed_rows(self, kinds: Iterable[str]) -> None:
        """Count the rows of one claim, by kind (one `inc` per kind)."""
        for kind, n in Tally(kinds).items():
            self.kind(kind).claimed.inc(n)

    def suppressed_rows(self, kinds: Iterable[str], source: str = SUPPRESSION_LIST) -> None:
        """Count messages that ended `suppressed`, by kind (one `inc` per kind)."""
        for kind, n in Tally(kinds).items():
            self.suppressed.labels(kind, source).inc(n)

    def record_send(self, kind: str, provider: str, outcome: str | None, seconds: float) -> None:
        """Queue one send's time: `send_duration` always, and the provider request (counted
        and timed) unless `outcome` is None (the provider never made one)."""
        self._sends.append((kind, provider, outcome, seconds))

    def flush(self) -> None:
        """Observe the queued send times, grouped by series."""
        sends = self._sends
        if not sends:
            return
        by_kind: dict[str, list[float]] = {}
        by_request: dict[tuple[str, str], list[float]] = {}
        while True:
            try:
                kind, provider, outcome, seconds = sends.popleft()
            except IndexError:
                break
            by_kind.setdefault(kind, []).append(seconds)
            if outcome is not None:
                by_request.setdefault((provider, outcome), []).append(seconds)
        for kind, values in by_kind.items():
            self.kind(kind).send_duration.observe_many(values)
        for (provider, outcome), values in by_request.items():
            requests, duration = self._provider(provider, outcome)
            requests.inc(len(values))
            duration.observe_many(values)

    def sent_rows(self, kind: str, latencies: Sequence[float]) -> None:
        """Count rows marked sent and observe their delivery latencies, for one kind."""
        series = self.kind(kind)
        series.sent.inc(len(latencies))
        series.delivery_latency.observe_many(latencies)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The current value of one sample (0 when absent); for tests and summaries."""
        self.flush()
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found
