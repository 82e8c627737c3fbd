"""Metrics counted per batch add up to what one call per message would have counted, and a
scrape never misses a send already made.

The batch histogram is judged against prometheus_client's own `Histogram` fed one value at
a time: the reference the alerts were written against."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from leasebox.runtime.batch_histogram import BatchHistogram
from leasebox.runtime.metrics import DELIVERY_LATENCY_BUCKETS, WorkerMetrics

LATENCIES = [0.0, 0.05, 0.0501, 0.1, 0.7, 2.5, 59.9, 60.0, 60.1, 599.0, 601.0, 10_000.0, 0.3]


def samples(histogram: Histogram | BatchHistogram) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for metric in histogram.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def reference(values: list[float]) -> Histogram:
    one_by_one = Histogram(
        "x", "x", ["kind"], buckets=DELIVERY_LATENCY_BUCKETS, registry=CollectorRegistry()
    )
    for value in values:
        one_by_one.labels("otp").observe(value)
    return one_by_one


def batch_histogram() -> BatchHistogram:
    return BatchHistogram(
        "x", "x", ["kind"], buckets=DELIVERY_LATENCY_BUCKETS, registry=CollectorRegistry()
    )


def test_a_batch_of_latencies_fills_the_buckets_one_observe_each_would() -> None:
    batched = batch_histogram()
    batched.labels("otp").observe_many(LATENCIES)

    assert samples(batched) == samples(reference(LATENCIES))
    assert samples(batched)["x_count[('kind', 'otp')]"] == len(LATENCIES)


def test_single_observations_and_batches_add_up_in_one_series() -> None:
    batched = batch_histogram()
    for value in LATENCIES[:4]:
        batched.labels("otp").observe(value)
    batched.labels("otp").observe_many(LATENCIES[4:])
    batched.labels("otp").observe_many([])

    assert samples(batched) == samples(reference(LATENCIES))


def test_the_batch_histogram_writes_the_exposition_a_histogram_writes() -> None:
    registry = CollectorRegistry()
    batched = BatchHistogram("x", "x", ["kind"], buckets=(1, 60), registry=registry)
    batched.labels("otp").observe_many([0.5, 60.0, 61.0])

    text = generate_latest(registry).decode()

    assert "# TYPE x histogram" in text
    assert 'x_bucket{kind="otp",le="1.0"} 1.0' in text
    assert 'x_bucket{kind="otp",le="60.0"} 2.0' in text
    assert 'x_bucket{kind="otp",le="+Inf"} 3.0' in text
    assert 'x_count{kind="otp"} 3.0' in text
    assert 'x_sum{kind="otp"} 121.5' in text


def test_a_batch_histogram_refuses_a_wrong_label_count_and_unordered_bounds() -> None:
    batched = batch_histogram()
    with pytest.raises(ValueError, match="expected labels"):
        batched.labels("otp", "extra")
    with pytest.raises(ValueError, match="increasing"):
        BatchHistogram("y", "y", [], buckets=(5, 1), registry=CollectorRegistry())


def test_a_claim_and_a_settled_batch_count_every_row_by_kind() -> None:
    metrics = WorkerMetrics()
    metrics.claimed_rows(["otp"] * 5 + ["invite"] * 2)
    metrics.sent_rows("otp", [0.1, 0.2, 70.0])

    assert metrics.value("leasebox_claimed_total", {"kind": "otp"}) == 5
    assert metrics.value("leasebox_claimed_total", {"kind": "invite"}) == 2
    assert metrics.value("leasebox_sent_total", {"kind": "otp"}) == 3
    assert metrics.value("leasebox_delivery_latency_seconds_count", {"kind": "otp"}) == 3
    assert (
        metrics.value("leasebox_delivery_latency_seconds_bucket", {"kind": "otp", "le": "60.0"})
        == 2
    )


def test_a_scrape_sees_every_send_recorded_before_it() -> None:
    metrics = WorkerMetrics()
    metrics.start_provider("smtp", "false")
    for seconds in (0.004, 0.02, 3.0):
        metrics.record_send("otp", "smtp", "accepted", seconds)
    metrics.record_send("otp", "smtp", None, 0.001)  # refused as expired: no request

    text = generate_latest(metrics.registry).decode()

    assert 'leasebox_send_duration_seconds_count{kind="otp"} 4.0' in text
    assert 'leasebox_provider_requests_total{outcome="accepted",provider="smtp"} 3.0' in text
    assert (
        'leasebox_provider_request_duration_seconds_bucket{le="0.005",outcome="accepted",'
        'provider="smtp"} 1.0' in text
    )


def test_the_in_flight_gauge_reads_the_live_count() -> None:
    metrics = WorkerMetrics()
    metrics.sending = 7
    assert metrics.value("leasebox_inflight_sends") == 7
    metrics.sending = 0
    assert metrics.value("leasebox_inflight_sends") == 0
