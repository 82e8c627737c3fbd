"""Metrics names and buckets, structured log lines, and the health endpoints."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import aiohttp
import pytest

from leasebox.runtime.health import HealthServer, build_app
from leasebox.runtime.logs import configure_logging, default_format, remove_logging
from leasebox.runtime.metrics import DELIVERY_LATENCY_BUCKETS, METRIC_NAMES, WorkerMetrics


def test_every_metric_in_the_design_is_exported_by_name() -> None:
    metrics = WorkerMetrics()
    metrics.claimed.labels("otp").inc()
    metrics.sent.labels("otp").inc()
    metrics.retries.labels("otp", "timeout").inc()
    metrics.dead_letters.labels("otp", "expired").inc()
    metrics.lease_lost.labels("otp").inc()
    metrics.leases_reclaimed.labels("otp").inc()
    metrics.send_duration.labels("otp").observe(0.1)
    metrics.delivery_latency.labels("otp").observe(42)
    text = metrics.exposition().decode()
    for name in METRIC_NAMES:
        assert f"\n{name}" in text or text.startswith(name) or f"# TYPE {name} " in text
    assert 'leasebox_retries_total{error_class="timeout",kind="otp"} 1.0' in text
    assert 'leasebox_dead_letters_total{kind="otp",reason="expired"} 1.0' in text
    assert "leasebox_inflight_sends 0.0" in text


def test_delivery_latency_has_the_bucket_the_sla_alerts_read() -> None:
    metrics = WorkerMetrics()
    metrics.delivery_latency.labels("otp").observe(59.0)
    metrics.delivery_latency.labels("otp").observe(61.0)
    text = metrics.exposition().decode()
    assert 'leasebox_delivery_latency_seconds_bucket{kind="otp",le="60.0"} 1.0' in text
    assert DELIVERY_LATENCY_BUCKETS == (
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        15,
        30,
        60,
        120,
        300,
        600,
    )


def test_each_worker_has_a_registry_of_its_own() -> None:
    first, second = WorkerMetrics(), WorkerMetrics()
    first.sent.labels("otp").inc()
    assert first.value("leasebox_sent_total", {"kind": "otp"}) == 1
    assert second.value("leasebox_sent_total", {"kind": "otp"}) == 0


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = configure_logging("json", "debug", stream=stream, mask=["hunter2-secret"])
    yield stream
    remove_logging(handler)


def test_json_logs_carry_the_context_fields_as_keys(log_stream: io.StringIO) -> None:
    logging.getLogger("leasebox.worker").warning(
        "dead-lettered (%s)",
        "rejected",
        extra={
            "outbox_id": 7,
            "aggregate_id": "user-9",
            "kind": "otp",
            "attempt": 1,
            "error_class": "smtp_550",
            "provider_message_id": None,
        },
    )
    entry = json.loads(log_stream.getvalue())
    assert entry["message"] == "dead-lettered (rejected)"
    assert entry["level"] == "warning"
    assert {k: entry[k] for k in ("outbox_id", "aggregate_id", "kind", "attempt")} == {
        "outbox_id": 7,
        "aggregate_id": "user-9",
        "kind": "otp",
        "attempt": 1,
    }
    assert entry["error_class"] == "smtp_550"
    assert "provider_message_id" not in entry  # None fields are left out


def test_known_secrets_are_masked_in_every_line(log_stream: io.StringIO) -> None:
    logging.getLogger("leasebox.worker").error("connect failed: password hunter2-secret wrong")
    assert "hunter2-secret" not in log_stream.getvalue()
    assert "***" in log_stream.getvalue()


def test_text_logs_append_the_fields_as_key_value_pairs() -> None:
    stream = io.StringIO()
    handler = configure_logging("text", "info", stream=stream)
    try:
        logging.getLogger("leasebox.worker").info("sent", extra={"outbox_id": 3, "kind": "otp"})
        logging.getLogger("leasebox.worker").debug("not shown at info")
    finally:
        remove_logging(handler)
    line = stream.getvalue().strip()
    assert line.endswith("leasebox.worker: sent outbox_id=3 kind=otp")
    assert "not shown" not in stream.getvalue()


def test_logs_are_json_unless_written_to_a_terminal() -> None:
    assert default_format(io.StringIO()) == "json"


def test_an_unknown_log_format_or_level_is_refused() -> None:
    with pytest.raises(ValueError, match="log format"):
        configure_logging("xml")
    with pytest.raises(ValueError, match="log level"):
        configure_logging("json", "chatty")


async def test_health_endpoints_answer_and_readiness_says_why_not() -> None:
    metrics = WorkerMetrics()
    metrics.sent.labels("otp").inc()
    problem: list[str | None] = [None]

    async def readiness() -> str | None:
        return problem[0]

    server = HealthServer(build_app(metrics, readiness), "127.0.0.1", 0)
    await server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/healthz") as response:
                assert (response.status, await response.text()) == (200, "ok\n")
            async with session.get(f"{base}/readyz") as response:
                assert (response.status, await response.text()) == (200, "ready\n")
            problem[0] = "database unreachable (OperationalError)"
            async with session.get(f"{base}/readyz") as response:
                assert response.status == 503
                assert (
                    await response.text() == "not ready: database unreachable (OperationalError)\n"
                )
            async with session.get(f"{base}/metrics") as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                assert 'leasebox_sent_total{kind="otp"} 1.0' in await response.text()
    finally:
        await server.stop()


async def test_a_crashing_readiness_check_is_a_503_not_an_error() -> None:
    async def readiness() -> str | None:
        raise RuntimeError("boom")

    server = HealthServer(build_app(WorkerMetrics(), readiness), "127.0.0.1", 0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/readyz"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 503
            assert "RuntimeError" in await response.text()
    finally:
        await server.stop()


def test_the_worker_registry_has_its_build_info_and_the_process_metrics() -> None:
    from prometheus_client import generate_latest

    from leasebox.version import __version__

    metrics = WorkerMetrics()
    labels = {"version": __version__, "component": "worker"}
    assert metrics.registry.get_sample_value("leasebox_build_info", labels) == 1
    exposition = generate_latest(metrics.registry).decode()
    assert "process_cpu_seconds_total" in exposition
    assert "python_info" in exposition
