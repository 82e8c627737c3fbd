"""Every metric the operator exports, in one place.

The chart's alert rules and the per-pool PrometheusRule are written against these names,
so they are fixed here and nowhere else. Pool metrics carry `namespace` and `pool` labels
(never a recipient, a kind list or anything secret). The oldest pending message is
exported as a timestamp rather than an age, so an alert computes `time() - x` and keeps
firing when the operator itself stops polling. Rates are counters (PromQL computes the
rate), and the registry carries `leasebox_build_info` and the process metrics like the
worker's. The registry is private to one operator run, so several runs in one process
(tests) do not collide.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from leasebox.store.backlog import Backlog
from leasebox.version import __version__

POOL_LABELS = ("namespace", "pool")
MESSAGE_STATES = ("pending", "ready", "processing", "dead", "expired_leases")
POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class OperatorMetrics:
    """The operator's metrics on a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.oldest_pending_timestamp = Gauge(
            "leasebox_pool_oldest_pending_timestamp_seconds",
            "Creation time of the oldest pending message (the poll time when none is pending)",
            POOL_LABELS,
            registry=r,
        )
        self.messages = Gauge(
            "leasebox_pool_messages",
            "Messages of the pool's kinds by state",
            (*POOL_LABELS, "state"),
            registry=r,
        )
        self.desired_replicas = Gauge(
            "leasebox_pool_desired_replicas",
            "Replicas the scaling policy asks for",
            POOL_LABELS,
            registry=r,
        )
        self.replicas = Gauge(
            "leasebox_pool_replicas",
            "Replicas requested on the worker Deployment",
            POOL_LABELS,
            registry=r,
        )
        self.ready_replicas = Gauge(
            "leasebox_pool_ready_replicas", "Ready worker pods", POOL_LABELS, registry=r
        )
        self.min_replicas = Gauge(
            "leasebox_pool_min_replicas", "The pool's minReplicas", POOL_LABELS, registry=r
        )
        self.max_replicas = Gauge(
            "leasebox_pool_max_replicas", "The pool's maxReplicas", POOL_LABELS, registry=r
        )
        self.sla_seconds = Gauge(
            "leasebox_pool_sla_seconds",
            "The pool's oldest-pending-age SLA",
            POOL_LABELS,
            registry=r,
        )
        self.arrivals = Counter(
            "leasebox_pool_arrivals",
            "Messages created for the pool's kinds, as the backlog polls estimate them "
            "(sends plus growth of the pending count)",
            POOL_LABELS,
            registry=r,
        )
        self.database_reachable = Gauge(
            "leasebox_pool_database_reachable",
            "1 when the last backlog poll succeeded",
            POOL_LABELS,
            registry=r,
        )
        self.quota = Gauge(
            "leasebox_pool_quota_per_second",
            "The pool's provider quota, messages a second (no series without one)",
            POOL_LABELS,
            registry=r,
        )
        self.quota_breach = Gauge(
            "leasebox_pool_quota_sla_breach_seconds",
            "Seconds until the backlog exceeds the SLA at the provider quota, while messages "
            "arrive faster than it (no series otherwise)",
            POOL_LABELS,
            registry=r,
        )
        self.paused = Gauge(
            "leasebox_pool_paused",
            "1 when the pool is paused (its workers held at 0)",
            POOL_LABELS,
            registry=r,
        )
        self.scale_events = Counter(
            "leasebox_operator_scale_events_total",
            "Replica changes made by the operator",
            (*POOL_LABELS, "direction"),
            registry=r,
        )
        self.poll_duration = Histogram(
            "leasebox_operator_poll_duration_seconds",
            "Duration of one backlog poll (query, decision and patches)",
            buckets=POLL_BUCKETS,
            registry=r,
        )
        self.poll_errors = Counter(
            "leasebox_operator_poll_errors_total",
            "Backlog polls that failed",
            POOL_LABELS,
            registry=r,
        )
        self.build_info = Gauge(
            "leasebox_build_info",
            "Always 1; the labels name the running version",
            ("version", "component"),
            registry=r,
        )
        self.build_info.labels(__version__, "operator").set(1)
        ProcessCollector(registry=r)
        r.register(PLATFORM_COLLECTOR)
        r.register(GC_COLLECTOR)
        self._server: Any = None

    def observe_spec(
        self,
        namespace: str,
        pool: str,
        *,
        sla: float,
        min_replicas: int,
        max_replicas: int,
        paused: bool,
    ) -> None:
        self.sla_seconds.labels(namespace, pool).set(sla)
        self.min_replicas.labels(namespace, pool).set(min_replicas)
        self.max_replicas.labels(namespace, pool).set(max_replicas)
        self.paused.labels(namespace, pool).set(1 if paused else 0)
        # A counter exists from 0 so that the first error shows up in rate() and increase().
        self.poll_errors.labels(namespace, pool)
        self.arrivals.labels(namespace, pool)

    def observe_backlog(
        self, namespace: str, pool: str, backlog: Backlog, *, arrived: float
    ) -> None:
        """Record one poll; `arrived` is the estimate of messages created since the last."""
        counts = {
            "pending": backlog.pending,
            "ready": backlog.ready,
            "processing": backlog.processing,
            "dead": backlog.dead,
            "expired_leases": backlog.expired_leases,
        }
        for state, count in counts.items():
            self.messages.labels(namespace, pool, state).set(count)
        oldest = backlog.oldest_pending_created_at or backlog.observed_at
        self.oldest_pending_timestamp.labels(namespace, pool).set(oldest.timestamp())
        self.arrivals.labels(namespace, pool).inc(max(0.0, arrived))
        self.database_reachable.labels(namespace, pool).set(1)

    def observe_replicas(
        self, namespace: str, pool: str, *, replicas: int, ready: int, desired: int
    ) -> None:
        self.replicas.labels(namespace, pool).set(replicas)
        self.ready_replicas.labels(namespace, pool).set(ready)
        self.desired_replicas.labels(namespace, pool).set(desired)

    def observe_quota(
        self, namespace: str, pool: str, quota: float | None, breach_in: float | None
    ) -> None:
        """The pool's quota and, while arrivals exceed it, when the SLA will be breached."""
        if quota is None:
            _remove(self.quota, namespace, pool)
        else:
            self.quota.labels(namespace, pool).set(quota)
        if breach_in is None:
            _remove(self.quota_breach, namespace, pool)
        else:
            self.quota_breach.labels(namespace, pool).set(breach_in)

    def poll_failed(self, namespace: str, pool: str) -> None:
        self.poll_errors.labels(namespace, pool).inc()
        self.database_reachable.labels(namespace, pool).set(0)

    def scaled(self, namespace: str, pool: str, old: int, new: int) -> None:
        self.scale_events.labels(namespace, pool, "up" if new > old else "down").inc()

    def forget(self, namespace: str, pool: str) -> None:
        """Drop every series of a deleted pool."""
        for metric in (
            self.oldest_pending_timestamp,
            self.desired_replicas,
            self.replicas,
            self.ready_replicas,
            self.min_replicas,
            self.max_replicas,
            self.sla_seconds,
            self.arrivals,
            self.database_reachable,
            self.quota,
            self.quota_breach,
            self.paused,
            self.poll_errors,
        ):
            _remove(metric, namespace, pool)
        for state in MESSAGE_STATES:
            _remove(self.messages, namespace, pool, state)
        for direction in ("up", "down"):
            _remove(self.scale_events, namespace, pool, direction)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:  # noqa: S104 (pod-local port)
        """Expose the registry on `port` (0 or less: not at all)."""
        if port > 0 and self._server is None:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _remove(metric: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
