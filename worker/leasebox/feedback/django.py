"""The receivers as a Django view, for a project that serves its webhooks from Django.

    from leasebox.feedback.django import feedback_view
    from leasebox.feedback.receiver import Receivers

    urlpatterns = [
        path("hooks/mail/<str:service>", feedback_view(Receivers.from_env())),
    ]

The view is CSRF-exempt (the services sign their requests instead), reads the body up to the
size limit, judges it like the ASGI app and stores the events on a connection of its own to
the database of the Django alias `using` (by default the leasebox app's `DATABASE`), in one
transaction committed before it answers: an event is never acknowledged before it is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from leasebox.feedback.metrics import FeedbackMetrics
from leasebox.feedback.receiver import (
    STORAGE_FAILED,
    Receivers,
    Reply,
    accept,
    label,
    outcome,
    refusal,
)
from leasebox.feedback.recording import record
from leasebox.feedback.signing import Inbound, Refused


def feedback_view(
    receivers: Receivers,
    *,
    using: str | None = None,
    schema: str | None = None,
    metrics: FeedbackMetrics | None = None,
) -> Callable[..., HttpResponse]:
    """A view taking the service as its `service` URL argument."""
    counted = metrics or FeedbackMetrics()

    @csrf_exempt
    def receive(request: HttpRequest, service: str) -> HttpResponse:
        if request.method != "POST":
            return _response(Reply(405, "method_not_allowed", (("Allow", "POST"),)))
        try:
            body = _body(request, receivers.max_body_bytes)
            inbound = Inbound(
                {k.lower(): v for k, v in request.headers.items()}, body, datetime.now(UTC)
            )
            accepted = accept(receivers, service, inbound)
        except Refused as refused:
            counted.request(label(service), refused.reason)
            return _response(refusal(service, refused))
        if not accepted.events and accepted.token is None:
            counted.request(service, accepted.note)
            return _response(Reply(200, accepted.note))
        try:
            with _connect(using) as conn:
                recorded = record(
                    conn,
                    service,
                    accepted.events,
                    token=accepted.token,
                    rules=receivers.rules,
                    schema=schema or _schema(),
                )
                conn.commit()
        except (psycopg.Error, OSError):
            counted.request(service, "storage_error")
            return _response(STORAGE_FAILED)
        counted.recorded(service, recorded)
        return _response(outcome(recorded))

    return receive


def _body(request: HttpRequest, limit: int) -> bytes:
    declared = str(request.META.get("CONTENT_LENGTH") or "")
    if declared.isdigit() and int(declared) > limit:
        raise Refused(413, "too_large")
    body = request.read(limit + 1)
    if len(body) > limit:
        raise Refused(413, "too_large")
    return body


def _connect(using: str | None) -> psycopg.Connection[Any]:
    from leasebox.django.conf import read_settings
    from leasebox.django.schema import connection_parameters

    return psycopg.connect(**connection_parameters(using or read_settings().database))


def _schema() -> str:
    from leasebox.django.conf import read_settings

    return read_settings().schema


def _response(reply: Reply) -> HttpResponse:
    response = HttpResponse(reply.text + "\n", status=reply.status, content_type="text/plain")
    for name, value in reply.headers:
        response[name] = value
    return response
