"""OpenTelemetry spans of each delivery, continuing the trace of the request that enqueued it.

Off unless the standard OTEL environment variables ask for traces (`OTEL_TRACES_EXPORTER`
other than `none`, or an `OTEL_EXPORTER_OTLP_ENDPOINT`/`..._TRACES_ENDPOINT`; never with
`OTEL_SDK_DISABLED=true`), and then it needs the `otel` extra. A worker without tracing
pays one `is None` check per step of a delivery.

Each attempt is one `leasebox deliver` span (CONSUMER), a child of the span that was current
when the message was enqueued (its stored trace context), so a sign-up's trace shows its
email's delivery; a message enqueued outside a trace starts a trace of its own. Under it:
`leasebox claim` (the claim statement, shared by its batch), `leasebox render`, `leasebox
send` (CLIENT: the provider call, with the provider's message id, or the failure's class)
and `leasebox settle` (from the outcome to its statement). Spans are recorded with the
times the worker measured, after the fact, so no span object lives across an `await` of
the hot path. Attributes name the message by id, kind, aggregate id, attempt and delivery
key; never its recipient, data, secrets or body.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from leasebox.errors import ConfigurationError
from leasebox.store.claiming import ClaimedMessage
from leasebox.tracecontext import bounded
from leasebox.version import __version__

TRACER_NAME = "leasebox.worker"
DEFAULT_SERVICE_NAME = "leasebox-worker"
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL environment variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return any(environ.get(name, "").strip() for name in _OTLP_ENDPOINTS)


def provider_from_environment(environ: Mapping[str, str]) -> Any | None:
    """A `TracerProvider` exporting as the OTEL variables say, or None when they ask for none."""
    if not tracing_wanted(environ):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ConfigurationError(
            "the OTEL_* variables ask for traces but the otel extra is not installed: "
            "pip install 'leasebox[otel]'"
        ) from None
    named = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": DEFAULT_SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(named))
    for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(","):
        name = name.strip()
        if name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol != "http/protobuf":
                raise ConfigurationError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: leasebox exports traces over "
                    "http/protobuf only"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name not in ("", "none"):
            raise ConfigurationError(
                f"OTEL_TRACES_EXPORTER {name!r}: leasebox knows otlp, console and none"
            )
    return provider


@dataclass
class _Delivery:
    span: Any
    context: Any
    settle_started: int | None = None
    outcome: str = ""


class DeliveryTracing:
    """The spans of the deliveries one worker has in hand, by outbox id."""

    def __init__(self, provider: Any, *, provider_name: str, worker_id: str) -> None:
        from opentelemetry import propagate, trace

        self._propagate = propagate
        self._trace = trace
        self._tracer = provider.get_tracer(TRACER_NAME, __version__)
        self._provider = provider
        self._provider_name = provider_name
        self._worker_id = worker_id
        self._open: dict[int, _Delivery] = {}

    def claimed(self, messages: Iterable[ClaimedMessage], started: int, ended: int) -> None:
        """Open a delivery span per claimed message, each with the claim as its first child."""
        from opentelemetry.trace import SpanKind

        batch = list(messages)
        for message in batch:
            carrier = bounded(message.trace_context) if message.trace_context else None
            parent = self._propagate.extract(carrier) if carrier else None
            attributes: dict[str, Any] = {
                "messaging.system": "leasebox",
                "messaging.operation.type": "process",
                "messaging.destination.name": message.kind,
                "messaging.message.id": str(message.id),
                "leasebox.kind": message.kind,
                "leasebox.attempt": message.attempts,
                "leasebox.delivery_key": message.delivery_key,
            }
            if message.aggregate_id is not None:
                attributes["leasebox.aggregate_id"] = message.aggregate_id
            span = self._tracer.start_span(
                "leasebox deliver",
                context=parent,
                kind=SpanKind.CONSUMER,
                start_time=started,
                attributes=attributes,
            )
            context = self._trace.set_span_in_context(span)
            self._tracer.start_span(
                "leasebox claim",
                context=context,
                start_time=started,
                attributes={"leasebox.worker_id": self._worker_id, "leasebox.batch": len(batch)},
            ).end(end_time=ended)
            self._open[message.id] = _Delivery(span, context)

    def rendered(self, outbox_id: int, started: int, failure: str | None = None) -> None:
        self._child(outbox_id, "leasebox render", started, failure=failure)

    def sent(
        self,
        outbox_id: int,
        started: int,
        *,
        provider_message_id: str | None = None,
        failure: str | None = None,
    ) -> None:
        """The provider call: its message id when it accepted, its failure's class if not."""
        from opentelemetry.trace import SpanKind

        attributes: dict[str, Any] = {"leasebox.provider": self._provider_name}
        if provider_message_id:
            attributes["leasebox.provider.message_id"] = provider_message_id
        self._child(
            outbox_id,
            "leasebox send",
            started,
            failure=failure,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )

    def settling(self, outbox_id: int, outcome: str) -> None:
        """The outcome is known and waits for its statement."""
        delivery = self._open.get(outbox_id)
        if delivery is not None:
            delivery.settle_started = time.time_ns()
            delivery.outcome = outcome

    def settled(self, outbox_id: int) -> None:
        """The outcome is written (or the lease was lost): close the settle and the delivery."""
        delivery = self._open.pop(outbox_id, None)
        if delivery is None:
            return
        from opentelemetry.trace import Status, StatusCode

        now = time.time_ns()
        outcome = delivery.outcome or "unsettled"
        self._tracer.start_span(
            "leasebox settle",
            context=delivery.context,
            start_time=delivery.settle_started or now,
            attributes={"leasebox.outcome": outcome},
        ).end(end_time=now)
        delivery.span.set_attribute("leasebox.outcome", outcome)
        if outcome == "dead":
            delivery.span.set_status(Status(StatusCode.ERROR, "dead-lettered"))
        delivery.span.end(end_time=now)

    def close(self) -> None:
        """End what is still open (a stop) and flush the exporters."""
        for outbox_id in list(self._open):
            self.settled(outbox_id)
        flush = getattr(self._provider, "force_flush", None)
        if flush is not None:
            flush()

    def _child(
        self,
        outbox_id: int,
        name: str,
        started: int,
        *,
        failure: str | None,
        kind: Any = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        delivery = self._open.get(outbox_id)
        if delivery is None:
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        span = self._tracer.start_span(
            name,
            context=delivery.context,
            kind=kind or SpanKind.INTERNAL,
            start_time=started,
            attributes=attributes,
        )
        if failure is not None:
            span.set_attribute("error.type", failure)
            span.set_status(Status(StatusCode.ERROR, failure))
        span.end()
