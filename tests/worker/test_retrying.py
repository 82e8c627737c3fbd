"""The backoff curve and the failure classification table, without I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasebox.delivery.retrying import (
    MAX_RETRY_AFTER,
    Failure,
    backoff_delay,
    classify,
    retry_delay,
    should_retry,
)
from leasebox.errors import (
    PayloadKeyError,
    PermanentProviderError,
    TemplateError,
    TransientProviderError,
)
from leasebox.states import DeadReason


def test_backoff_doubles_from_the_base_until_the_cap() -> None:
    ceilings = [backoff_delay(a, base=2, cap=300, rng=lambda: 0.999999) for a in range(1, 11)]
    assert [round(c) for c in ceilings] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


def test_backoff_without_jitter_luck_is_half_the_ceiling() -> None:
    assert backoff_delay(1, base=2, cap=300, rng=lambda: 0.0) == 1.0
    assert backoff_delay(20, base=2, cap=300, rng=lambda: 0.0) == 150.0


@given(
    attempt=st.integers(min_value=1, max_value=10_000),
    base=st.floats(min_value=0.001, max_value=60),
    cap=st.floats(min_value=60, max_value=3600),
    draw=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_stays_within_the_upper_half_of_its_capped_ceiling(
    attempt: int, base: float, cap: float, draw: float
) -> None:
    delay = backoff_delay(attempt, base=base, cap=cap, rng=lambda: draw)
    ceiling = min(cap, base * 2 ** min(attempt - 1, 62))
    assert ceiling / 2 <= delay <= ceiling
    assert delay <= cap


def test_backoff_rejects_an_attempt_below_one() -> None:
    with pytest.raises(ValueError, match="attempt"):
        backoff_delay(0, base=2, cap=300)


@pytest.mark.parametrize(
    ("exc", "permanence", "code"),
    [
        (TransientProviderError("smtp_421", "421 busy"), "transient", "smtp_421"),
        (TransientProviderError("http_503", "503"), "transient", "http_503"),
        (TransientProviderError("http_429", "429"), "transient", "http_429"),
        (PermanentProviderError("smtp_550", "550 no such user"), "permanent", "smtp_550"),
        (PermanentProviderError("http_400", "400"), "permanent", "http_400"),
        (TemplateError("template 'x' has no subject.txt.j2"), "permanent", "template"),
        (
            PayloadKeyError("secrets are encrypted but keys are not set"),
            "transient",
            "payload_keys",
        ),
        (TimeoutError(), "transient", "timeout"),
        (ConnectionRefusedError(111, "refused"), "transient", "connection"),
        (OSError("network unreachable"), "transient", "connection"),
        (RuntimeError("a bug"), "transient", "unexpected"),
    ],
)
def test_failures_are_classified_by_the_table(
    exc: BaseException, permanence: str, code: str
) -> None:
    failure = classify(exc)
    assert (failure.permanence, failure.code) == (permanence, code)
    assert failure.detail


def test_an_unexpected_exception_message_is_not_kept() -> None:
    failure = classify(ValueError("code 123456 for alice@example.com"))
    assert "123456" not in failure.detail
    assert "alice" not in failure.detail


def test_permanent_provider_errors_dead_letter_as_rejected_and_templates_as_invalid() -> None:
    assert classify(PermanentProviderError("smtp_553", "553")).dead_reason == DeadReason.REJECTED
    assert classify(TemplateError("bad")).dead_reason == DeadReason.INVALID_MESSAGE


def test_only_transient_failures_with_attempts_left_are_retried() -> None:
    transient = classify(TransientProviderError("timeout", "timed out"))
    permanent = classify(PermanentProviderError("smtp_550", "550"))
    assert should_retry(transient, attempts=7, max_attempts=8)
    assert not should_retry(transient, attempts=8, max_attempts=8)
    assert not should_retry(permanent, attempts=1, max_attempts=8)


def test_a_providers_retry_after_longer_than_the_backoff_is_the_delay() -> None:
    asked = classify(TransientProviderError("http_429", "slow down", retry_after=120))
    assert asked.retry_after == 120
    assert retry_delay(asked, 1, base=2, cap=300, rng=lambda: 0.5) == 120


def test_a_retry_after_shorter_than_the_backoff_leaves_the_backoff() -> None:
    asked = Failure("transient", "http_429", "slow down", retry_after=0.5)
    assert retry_delay(asked, 4, base=2, cap=300, rng=lambda: 0.0) == 8.0


def test_a_retry_after_is_bounded_so_a_bogus_header_cannot_park_a_message() -> None:
    asked = Failure("transient", "http_429", "slow down", retry_after=10**9)
    assert retry_delay(asked, 1, base=2, cap=300) == MAX_RETRY_AFTER


def test_without_a_retry_after_the_delay_is_the_backoff() -> None:
    plain = classify(TransientProviderError("timeout", "late"))
    assert plain.retry_after is None
    assert retry_delay(plain, 3, base=2, cap=300, rng=lambda: 0.0) == 4.0
