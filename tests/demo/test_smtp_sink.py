"""The SMTP sink records what it accepts and plays a provider's transient and permanent refusals."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.providers.base import (
    Email,
    derived_message_id,
)
from leasebox.errors import PermanentProviderError, TransientProviderError
from leasebox.testing.smtp_sink import SmtpSink


def email(recipient: str = "ada@example.com", key: str = "otp:user-1:c1") -> Email:
    return Email(
        outbox_id=1,
        kind="otp",
        aggregate_id="user-1",
        delivery_key=key,
        recipient=recipient,
        subject="Your code",
        text="Your code is:\n\n    493817\n",
        html=None,
        attempt=1,
    )


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    with SmtpSink(rejected=["bounce@example.com"], keep_bodies=True, clock=lambda: 42.0) as s:
        yield s


async def test_an_accepted_message_is_recorded_by_its_message_id_and_delivery_key(
    sink: SmtpSink,
) -> None:
    provider = provider_from_url(sink.url)
    await provider.start()
    try:
        await provider.send(email())
        await provider.send(email())
    finally:
        await provider.close()
    (copies,) = sink.copies_by_delivery_key().values()
    assert len(copies) == 2
    assert {c.message_id for c in copies} == {derived_message_id("otp:user-1:c1")}
    assert copies[0].recipient == "ada@example.com"
    assert copies[0].received_at == 42.0
    assert "493817" in (copies[0].text or "")


async def test_a_failure_window_answers_451_and_records_nothing(sink: SmtpSink) -> None:
    provider = provider_from_url(sink.url)
    await provider.start()
    sink.failing = True
    try:
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(email())
        sink.failing = False
        await provider.send(email())
    finally:
        await provider.close()
    assert caught.value.code == "smtp_451"
    assert sink.transient_rejections == 1
    assert len(sink.received) == 1


async def test_a_rejected_address_gets_a_permanent_550(sink: SmtpSink) -> None:
    provider = provider_from_url(sink.url)
    await provider.start()
    try:
        with pytest.raises(PermanentProviderError) as caught:
            await provider.send(email("Bounce@example.com"))
    finally:
        await provider.close()
    assert caught.value.code == "smtp_550"
    assert sink.permanent_rejections == 1
    assert sink.received == []
