"""The caller's trace context, carried with a message from `enqueue` to the worker.

When the application traces its requests with OpenTelemetry, `enqueue` stores the current
span's context with the message (W3C `traceparent` and `tracestate`, or whatever the
application's propagators write), and the worker continues that trace: a sign-up's trace
shows its email's delivery. Without the `opentelemetry-api` package, or outside a recorded
span, nothing is stored and the cost is one check. The carrier never holds anything but
the propagators' headers: no recipient, no secret.
"""

from __future__ import annotations

from typing import Any

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # the `otel` extra is not installed: nothing to carry
    _propagate = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

# What a stored carrier may hold: the propagators' few short headers.
MAX_ENTRIES = 8
MAX_VALUE_LENGTH = 512


def current_trace_context() -> dict[str, str] | None:
    """The current span's context as a carrier to store, or None when there is none."""
    if _trace is None or not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return bounded(carrier)


def bounded(carrier: Any) -> dict[str, str] | None:
    """`carrier` when it is a small mapping of short strings, else None (never an error)."""
    if not hasattr(carrier, "items") or len(carrier) > MAX_ENTRIES:
        return None
    kept = {
        str(k): v
        for k, v in carrier.items()
        if isinstance(v, str) and len(v) <= MAX_VALUE_LENGTH and len(str(k)) <= 64
    }
    return kept or None
