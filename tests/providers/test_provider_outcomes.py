"""What one provider request amounted to, for the provider-health metrics, for every provider."""

from __future__ import annotations

import pytest

from leasebox.delivery.providers.base import RequestOutcome, idempotency, request_outcome
from leasebox.delivery.providers.development import NullProvider
from leasebox.delivery.providers.mail_api import ApiAnswer, seconds_until, status_error
from leasebox.errors import PermanentProviderError, TransientProviderError
from leasebox.runtime.metrics import PROVIDER_OUTCOMES, WorkerMetrics


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, RequestOutcome.ACCEPTED),
        (TransientProviderError("timeout", "x"), RequestOutcome.TIMEOUT),
        (TransientProviderError("connection", "x"), RequestOutcome.CONNECTION),
        (TransientProviderError("tls", "x"), RequestOutcome.CONNECTION),
        (PermanentProviderError("smtp_auth", "x"), RequestOutcome.ACCOUNT),
        (PermanentProviderError("smtp_550", "x"), RequestOutcome.REJECTED),
        (TransientProviderError("smtp_421", "x"), RequestOutcome.UNAVAILABLE),
        (TransientProviderError("smtp_451", "x"), RequestOutcome.ERROR),
        (TransientProviderError("http_429", "x"), RequestOutcome.THROTTLED),
        (TransientProviderError("http_401", "x"), RequestOutcome.ACCOUNT),
        (TransientProviderError("http_503", "x"), RequestOutcome.UNAVAILABLE),
        (PermanentProviderError("http_422", "x"), RequestOutcome.REJECTED),
        (TransientProviderError("resend_x", "x", outcome="throttled"), RequestOutcome.THROTTLED),
        (TransientProviderError("odd", "x", outcome="not-an-outcome"), RequestOutcome.ERROR),
        (TimeoutError(), RequestOutcome.TIMEOUT),
        (ConnectionResetError(), RequestOutcome.CONNECTION),
        (ValueError(), RequestOutcome.ERROR),
    ],
)
def test_each_failure_has_one_outcome(error: BaseException | None, outcome: RequestOutcome) -> None:
    assert request_outcome(error) is outcome


def test_the_metrics_know_every_outcome() -> None:
    assert tuple(o.value for o in RequestOutcome) == PROVIDER_OUTCOMES


def test_a_provider_that_says_nothing_of_idempotency_is_unknown() -> None:
    assert idempotency(NullProvider()) == "unknown"


def test_the_provider_series_exist_from_zero() -> None:
    metrics = WorkerMetrics()
    metrics.start_provider("postmark", "false")
    text = metrics.exposition().decode()
    assert 'leasebox_provider_info{idempotent="false",provider="postmark"} 1.0' in text
    for outcome in PROVIDER_OUTCOMES:
        assert (
            f'leasebox_provider_requests_total{{outcome="{outcome}",provider="postmark"}} 0.0'
            in text
        )


def test_a_reset_time_in_the_past_or_unreadable_gives_no_wait() -> None:
    assert seconds_until("1000") is None
    assert seconds_until("soon") is None
    assert seconds_until(None) is None


@pytest.mark.parametrize(
    ("status", "transient", "outcome"),
    [
        (400, False, RequestOutcome.REJECTED),
        (401, True, RequestOutcome.ACCOUNT),
        (403, True, RequestOutcome.ACCOUNT),
        (404, False, RequestOutcome.REJECTED),
        (408, True, RequestOutcome.TIMEOUT),
        (413, False, RequestOutcome.REJECTED),
        (429, True, RequestOutcome.THROTTLED),
        (500, True, RequestOutcome.UNAVAILABLE),
        (503, True, RequestOutcome.UNAVAILABLE),
    ],
)
def test_a_service_status_maps_onto_transient_or_permanent(
    status: int, transient: bool, outcome: RequestOutcome
) -> None:
    error = status_error("sendgrid", ApiAnswer(status, {"Retry-After": "7"}, {"x": "body"}))

    assert error.transient is transient
    assert request_outcome(error) is outcome
    assert error.code == f"sendgrid_{status}"
    assert error.retry_after == 7
    assert "body" not in str(error)
