"""The worker on real PostgreSQL, sending through each mail service's stand-in.

Four rows per service: one the service accepts, one it refuses, one it throttles, one it
answers with a 5xx. After one drained run the rows say what the service said: sent with the
service's message id, dead with the service's code, pending again after the service's wait
(or the backoff where the service names none), and the provider-health metrics count one
request per outcome.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.worker import Worker
from support.mail_services import (
    SERVICES,
    THROTTLE_SECONDS,
    provider_url,
    serve_stand_in,
    use_stand_in_credentials,
)
from support.worker_doubles import Insert, ManualClock, row_of

REJECTION = {
    "sendgrid": "sendgrid_400",
    "postmark": "postmark_406",
    "mailgun": "mailgun_400",
    "resend": "resend_validation_error",
    "ses": "ses_message_rejected",
}
THROTTLING = {
    "sendgrid": "sendgrid_429",
    "postmark": "postmark_429",
    "mailgun": "mailgun_429",
    "resend": "resend_rate_limit_exceeded",
    "ses": "ses_too_many_requests",
}
SERVER_ERROR = {
    "sendgrid": "sendgrid_500",
    "postmark": "postmark_500",
    "mailgun": "mailgun_500",
    "resend": "resend_application_error",
    "ses": "ses_internal_failure",
}


@pytest.mark.parametrize("service", SERVICES)
async def test_each_row_ends_as_the_service_answered(
    service: str,
    db_pool: AsyncConnectionPool,
    fake_clock: ManualClock,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_stand_in_credentials(monkeypatch)
    ids = {
        local: db_insert(recipient=f"{local}@example.com", code="551204")
        for local in ("ok", "rejected", "throttled", "down")
    }
    async with serve_stand_in(service) as stand_in:
        provider = provider_from_url(provider_url(stand_in))
        await provider.start()
        worker = Worker(
            WorkerSettings(
                kinds=("otp",),
                concurrency=4,
                poll_interval=0.02,
                listen=False,
                drain=True,
                worker_id="services-test",
            ),
            db_pool,
            provider,
            TemplateRenderer(),
            clock=fake_clock,
            rng=lambda: 0.0,
        )
        try:
            async with asyncio.timeout(30):
                await worker.run()
        finally:
            await provider.close()

    sent = row_of(db_conn, ids["ok"])
    assert sent["status"] == "sent"
    assert sent["provider_message_id"]
    assert stand_in.delivered == ["ok@example.com"]

    rejected = row_of(db_conn, ids["rejected"])
    if service == "postmark":  # 406, an inactive recipient: Postmark suppresses it, so do we
        assert (rejected["status"], rejected["dead_reason"]) == ("suppressed", None)
        found = db_conn.execute(
            "SELECT error_class, error FROM leasebox.history"
            " WHERE outbox_id = %s AND event = 'suppressed'",
            (ids["rejected"],),
        ).fetchone()
        db_conn.rollback()
        assert found is not None
        error_class, error = found
    else:
        assert (rejected["status"], rejected["dead_reason"]) == ("dead", "rejected")
        error_class, error = rejected["last_error_class"], rejected["last_error"]
    assert error_class == REJECTION[service]
    assert "rejected@example.com" not in error

    throttled = row_of(db_conn, ids["throttled"])
    assert (throttled["status"], throttled["attempts"]) == ("pending", 1)
    assert throttled["last_error_class"] == THROTTLING[service]
    wait = throttled["available_at"] - fake_clock.now
    if service in ("sendgrid", "resend"):  # the service said how long: its wait wins
        assert (
            timedelta(seconds=THROTTLE_SECONDS - 2) <= wait <= timedelta(seconds=THROTTLE_SECONDS)
        )
    else:  # no wait documented: the backoff (rng 0: half of the 2 s base)
        assert wait == timedelta(seconds=1)

    down = row_of(db_conn, ids["down"])
    assert (down["status"], down["last_error_class"]) == ("pending", SERVER_ERROR[service])

    idempotent = "true" if service == "resend" else "false"
    assert (
        worker.metrics.value(
            "leasebox_provider_info", {"provider": service, "idempotent": idempotent}
        )
        == 1
    )
    for outcome in ("accepted", "rejected", "throttled", "unavailable"):
        labels = {"provider": service, "outcome": outcome}
        assert worker.metrics.value("leasebox_provider_requests_total", labels) == 1, outcome
        count = "leasebox_provider_request_duration_seconds_count"
        assert worker.metrics.value(count, labels) == 1, outcome
    labels = {"provider": service, "outcome": "timeout"}
    assert worker.metrics.value("leasebox_provider_requests_total", labels) == 0
