"""OpenTelemetry traces: `enqueue` records the caller's trace context, the worker continues it.

A request span enqueues a message; a worker sends it through a real SMTP server on loopback
and records, under one `leasebox deliver` span that is a child of the request's span, the
claim, the render, the provider call (with the provider's message id) and the settling. The
spans go to the SDK's in-memory exporter; none of them holds the recipient or the code.
Tracing is off unless the OTEL environment variables ask for it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from psycopg_pool import AsyncConnectionPool

from leasebox import OutboxMessage, enqueue, enqueue_many
from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.errors import ConfigurationError
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.tracing import DeliveryTracing, provider_from_environment, tracing_wanted
from leasebox.runtime.worker import Worker
from leasebox.testing.smtp_sink import SmtpSink
from support.running_worker import SETTINGS

pytestmark = pytest.mark.db
CODE = "493817"
CIPHER = PayloadCipher(allow_plaintext=True)
BOUNCING = "bounce@example.com"


@pytest.fixture
def traces() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _otp(recipient: str, user: str) -> OutboxMessage:
    return OutboxMessage(
        kind="otp",
        recipient=recipient,
        aggregate_id=user,
        data={"minutes_valid": 10},
        secrets={"code": CODE},
    )


async def _drain(
    db_pool: AsyncConnectionPool, sink: SmtpSink, tracing: DeliveryTracing | None
) -> None:
    provider = provider_from_url(sink.url)
    await provider.start()
    settings = dataclasses.replace(SETTINGS, kinds=("otp",), drain=True)
    worker = Worker(settings, db_pool, provider, TemplateRenderer(), cipher=CIPHER, tracing=tracing)
    try:
        await worker.run()
    finally:
        await provider.close()


def _by_name(spans: tuple[ReadableSpan, ...], parent: ReadableSpan) -> dict[str, ReadableSpan]:
    assert parent.context is not None
    return {
        s.name: s
        for s in spans
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    }


async def test_a_delivery_continues_the_trace_of_the_request_that_enqueued_it(
    db_dsn: str,
    db_pool: AsyncConnectionPool,
    traces: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traces
    app = provider.get_tracer("the application")
    with psycopg.connect(db_dsn) as conn:
        with app.start_as_current_span("POST /signup") as signup:
            traced = enqueue(conn, _otp("ada@example.com", "user-1"), cipher=CIPHER).outbox_id
            bounced = enqueue(conn, _otp(BOUNCING, "user-2"), cipher=CIPHER).outbox_id
        untraced = enqueue(conn, _otp("grace@example.com", "user-3"), cipher=CIPHER).outbox_id
        conn.commit()
        stored: dict[int, Any] = dict(
            conn.execute("SELECT id, trace_context FROM leasebox.outbox").fetchall()
        )
    request = signup.get_span_context()
    assert stored[untraced] is None
    assert stored[traced]["traceparent"].startswith(
        f"00-{request.trace_id:032x}-{request.span_id:016x}-"
    )
    with SmtpSink(rejected=[BOUNCING]) as sink:
        tracing = DeliveryTracing(provider, provider_name="smtp", worker_id="w1")
        await _drain(db_pool, sink, tracing)
        assert len(sink.received) == 2

    spans = exporter.get_finished_spans()
    deliveries = {
        int(str(s.attributes["messaging.message.id"])): s
        for s in spans
        if s.name == "leasebox deliver" and s.attributes
    }
    assert set(deliveries) == {traced, bounced, untraced}
    sent = deliveries[traced]
    assert sent.kind is SpanKind.CONSUMER
    assert sent.context is not None
    assert sent.parent is not None
    assert (sent.context.trace_id, sent.parent.span_id) == (request.trace_id, request.span_id)
    steps = _by_name(spans, sent)
    assert set(steps) == {"leasebox claim", "leasebox render", "leasebox send", "leasebox settle"}
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT provider_message_id FROM leasebox.history "
            "WHERE outbox_id = %s AND event = 'sent'",
            (traced,),
        ).fetchone()
    assert row is not None
    assert row[0]
    call = steps["leasebox send"]
    assert call.kind is SpanKind.CLIENT
    assert call.attributes is not None
    assert call.attributes["leasebox.provider.message_id"] == row[0]
    assert dict(steps["leasebox settle"].attributes or {}) == {"leasebox.outcome": "sent"}
    claim, render = steps["leasebox claim"], steps["leasebox render"]
    assert claim.end_time is not None
    assert render.start_time is not None
    assert claim.end_time <= render.start_time
    assert sent.attributes is not None
    assert (sent.attributes["leasebox.attempt"], sent.attributes["leasebox.aggregate_id"]) == (
        1,
        "user-1",
    )

    failed = _by_name(spans, deliveries[bounced])
    assert failed["leasebox send"].status.status_code is StatusCode.ERROR
    assert (failed["leasebox send"].attributes or {})["error.type"] == "smtp_550"
    assert (failed["leasebox settle"].attributes or {})["leasebox.outcome"] == "dead"
    assert deliveries[bounced].status.status_code is StatusCode.ERROR

    alone = deliveries[untraced]
    assert alone.parent is None
    assert alone.context is not None
    assert alone.context.trace_id != request.trace_id

    everything = json.dumps([json.loads(s.to_json()) for s in spans])
    for secret in (CODE, "ada@example.com", "grace@example.com", BOUNCING):
        assert secret not in everything


async def test_a_batch_carries_the_context_and_a_worker_without_tracing_records_nothing(
    db_dsn: str,
    db_pool: AsyncConnectionPool,
    traces: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traces
    app = provider.get_tracer("the application")
    with psycopg.connect(db_dsn) as conn:
        with app.start_as_current_span("POST /invite-team"):
            receipts = enqueue_many(
                conn, [_otp(f"u{n}@example.com", f"user-{n}") for n in range(3)], cipher=CIPHER
            )
        conn.commit()
        contexts = [
            conn.execute(
                "SELECT trace_context FROM leasebox.outbox WHERE id = %s", (r.outbox_id,)
            ).fetchone()
            for r in receipts
        ]
    assert all(c is not None and c[0]["traceparent"].startswith("00-") for c in contexts)
    with SmtpSink() as sink:
        await _drain(db_pool, sink, None)
        assert len(sink.received) == 3
    assert [s.name for s in exporter.get_finished_spans()] == ["POST /invite-team"]


def test_tracing_is_off_unless_the_otel_variables_ask_for_it() -> None:
    assert not tracing_wanted({})
    assert not tracing_wanted({"OTEL_SERVICE_NAME": "mail"})
    assert not tracing_wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    )
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing_wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert provider_from_environment({}) is None
    console = provider_from_environment({"OTEL_TRACES_EXPORTER": "console"})
    assert console is not None
    resource: Any = console.resource
    assert resource.attributes["service.name"] == "leasebox-worker"
    console.shutdown()
    with pytest.raises(ConfigurationError, match="otlp, console and none"):
        provider_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ConfigurationError, match="http/protobuf only"):
        provider_from_environment(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        )
