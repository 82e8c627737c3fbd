"""What one provider request amounted to, for the provider-health metrics, for every provider."""

from __future__ import annotations

import pytest

from leasebox.delivery.providers.base import Outcome, idempotency, request_outcome
from leasebox.delivery.providers.development import NullProvider
from leasebox.delivery.providers.mail_api import ApiAnswer, seconds_until, status_error
from leasebox.errors import PermanentProviderError, TransientProviderError
from leasebox.runtime.metrics import PROVIDER_OUTCOMES, WorkerMetrics


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, Outcome.ACCEPTED),
        (TransientProviderError("timeout", "x"), Outcome.TIMEOUT),
        (TransientProviderError("connection", "x"), Outcome.CONNECTION),
        (TransientProviderError("tls", "x"), Outcome.CONNECTION),
        (PermanentProviderError("smtp_auth", "x"), Outcome.ACCOUNT),
        (PermanentProviderError("smtp_550", "x"), Outcome.REJECTED),
        (TransientProviderError("smtp_421", "x"), Outcome.UNAVAILABLE),
        (TransientProviderError("smtp_451", "x"), Outcome.ERROR),
        (TransientProviderError("http_429", "x"), Outcome.THROTTLED),
        (TransientProviderError("http_401", "x"), Outcome.ACCOUNT),
        (TransientProviderError("http_503", "x"), Outcome.UNAVAILABLE),
        (PermanentProviderError("http_422", "x"), Outcome.REJECTED),
        (TransientProviderError("resend_x", "x", outcome="throttled"), Outcome.THROTTLED),
        (TransientProviderError("odd", "x", outcome="not-an-outcome"), Outcome.ERROR),
        (TimeoutError(), Outcome.TIMEOUT),
        (ConnectionResetError(), Outcome.CONNECTION),
        (ValueError(), Outcome.ERROR),
    ],
)
def test_each_failure_has_one_outcome(error: BaseException | None, outcome: Outcome) -> None:
    assert request_outcome(error) is outcome


def test_the_metrics_know_every_outcome() -> None:
    assert tuple(o.value for o in Outcome) == PROVIDER_OUTCOMES


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
        (400, False, Outcome.REJECTED),
        (401, True, Outcome.ACCOUNT),
        (403, True, Outcome.ACCOUNT),
        (404, False, Outcome.REJECTED),
        (408, True, Outcome.TIMEOUT),
        (413, False, Outcome.REJECTED),
        (429, True, Outcome.THROTTLED),
        (500, True, Outcome.UNAVAILABLE),
        (503, True, Outcome.UNAVAILABLE),
    ],
)
def test_a_service_status_maps_onto_transient_or_permanent(
    status: int, transient: bool, outcome: Outcome
) -> None:
    error = status_error("sendgrid", ApiAnswer(status, {"Retry-After": "7"}, {"x": "body"}))

    assert error.transient is transient
    assert request_outcome(error) is outcome
    assert error.code == f"sendgrid_{status}"
    assert error.retry_after == 7
    assert "body" not in str(error)
