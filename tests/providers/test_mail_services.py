"""Each mail service's provider against a local stand-in that answers as the service documents.

Every test runs for SendGrid, Postmark, Mailgun, Resend and SES (`support.mail_services`):
an accepted message reads the service's message id; a refused recipient is permanent; a 429
is transient with the service's wait; a 5xx and a wrong key are transient (the key is the
account's problem, not the message's); and no error ever quotes the answer's body, the
recipient or the key.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest

from leasebox.delivery.providers import Email, Provider, provider_from_url
from leasebox.delivery.providers.base import (
    RequestOutcome,
    idempotency,
    key_digest,
    request_outcome,
)
from leasebox.errors import PermanentProviderError, ProviderError, TransientProviderError
from support.mail_services import (
    AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY,
    KEY,
    SERVICES,
    THROTTLE_SECONDS,
    StandIn,
    provider_url,
    serve_stand_in,
    use_stand_in_credentials,
)

CODE = "771204"


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    use_stand_in_credentials(monkeypatch)


@pytest.fixture(params=SERVICES)
async def stand_in(request: pytest.FixtureRequest) -> AsyncIterator[StandIn]:
    async with serve_stand_in(str(request.param)) as running:
        yield running


def email(recipient: str = "ok@example.com", key: str = "otp:user-7:challenge-1") -> Email:
    return Email(
        outbox_id=41,
        kind="otp",
        aggregate_id="user-7",
        delivery_key=key,
        recipient=recipient,
        subject="Your sign-in code",
        text=f"Your code is {CODE}",
        html=f"<p>Your code is <b>{CODE}</b></p>",
        attempt=2,
    )


async def started(url: str) -> Provider:
    provider = provider_from_url(url, timeout=5.0)
    await provider.start()
    return provider


async def send(stand_in: StandIn, message: Email, *, wait: float = 5.0) -> Any:
    provider = await started(provider_url(stand_in, timeout=wait))
    try:
        return await provider.send(message)
    finally:
        await provider.close()


async def refused(stand_in: StandIn, recipient: str) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await send(stand_in, email(recipient))
    error = caught.value
    assert CODE not in str(error)
    assert recipient not in str(error)
    assert KEY not in str(error)
    assert AWS_SECRET_ACCESS_KEY not in str(error)
    return error


def carried_key(stand_in: StandIn) -> list[str]:
    """Where the last request carried the delivery key (or its digest), as the service has it."""
    body = stand_in.received[-1].body
    headers = stand_in.received[-1].headers
    if stand_in.service == "sendgrid":
        return [body["custom_args"]["leasebox_delivery_key"], body["headers"]["X-Leasebox-Key"]]
    if stand_in.service == "postmark":
        return [body["Metadata"]["leasebox_key"], body["Headers"][0]["Value"]]
    if stand_in.service == "mailgun":
        return [body["v:leasebox-delivery-key"], body["h:X-Leasebox-Key"]]
    if stand_in.service == "resend":
        return [headers["Idempotency-Key"], body["headers"]["X-Leasebox-Key"]]
    tags = {tag["Name"]: tag["Value"] for tag in body["EmailTags"]}
    return [tags["leasebox_key"], body["Content"]["Simple"]["Headers"][0]["Value"]]


async def test_an_accepted_message_returns_the_services_message_id(stand_in: StandIn) -> None:
    result = await send(stand_in, email())

    assert stand_in.delivered == ["ok@example.com"]
    assert result.provider_message_id
    received = stand_in.received[-1]
    if stand_in.service == "sendgrid":
        assert received.body["content"][0] == {
            "type": "text/plain",
            "value": f"Your code is {CODE}",
        }
        assert received.body["from"] == {"email": "no-reply@example.com", "name": "Example"}
    elif stand_in.service == "mailgun":
        assert received.body["from"] == "Example <no-reply@example.com>"
        assert received.body["html"] == f"<p>Your code is <b>{CODE}</b></p>"


async def test_the_delivery_key_travels_where_the_service_can_show_it(stand_in: StandIn) -> None:
    await send(stand_in, email(key="otp:user-7:challenge-1"))

    original, header = carried_key(stand_in)
    assert header == key_digest("otp:user-7:challenge-1")
    assert original in ("otp:user-7:challenge-1", key_digest("otp:user-7:challenge-1"))
    if stand_in.service == "resend":
        assert original == "otp:user-7:challenge-1", "Resend dedupes on Idempotency-Key"


async def test_a_refused_recipient_is_a_permanent_rejection(stand_in: StandIn) -> None:
    error = await refused(stand_in, "rejected@example.com")

    assert isinstance(error, PermanentProviderError)
    assert request_outcome(error) is RequestOutcome.REJECTED
    assert (
        error.code
        == {
            "sendgrid": "sendgrid_400",
            "postmark": "postmark_406",
            "mailgun": "mailgun_400",
            "resend": "resend_validation_error",
            "ses": "ses_message_rejected",
        }[stand_in.service]
    )
    assert stand_in.delivered == []


async def test_throttling_is_transient_and_carries_the_services_wait(stand_in: StandIn) -> None:
    error = await refused(stand_in, "throttled@example.com")

    assert isinstance(error, TransientProviderError)
    assert request_outcome(error) is RequestOutcome.THROTTLED
    if stand_in.service in ("sendgrid", "resend"):
        assert error.retry_after is not None
        assert THROTTLE_SECONDS - 2 <= error.retry_after <= THROTTLE_SECONDS
    else:  # Postmark, Mailgun and SES document no wait: the worker's backoff applies
        assert error.retry_after is None


async def test_a_server_error_is_transient(stand_in: StandIn) -> None:
    error = await refused(stand_in, "down@example.com")

    assert isinstance(error, TransientProviderError)
    assert request_outcome(error) is RequestOutcome.UNAVAILABLE


async def test_a_wrong_key_is_the_accounts_problem_and_is_retried(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEASEBOX_TEST_API_KEY", "wrong-key-0000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSOMEONEELSE")

    with pytest.raises(TransientProviderError) as caught:
        await send(stand_in, email())

    assert request_outcome(caught.value) is RequestOutcome.ACCOUNT
    assert "wrong-key-0000" not in str(caught.value)


async def test_a_service_slower_than_the_timeout_is_a_transient_timeout(
    stand_in: StandIn,
) -> None:
    with pytest.raises(TransientProviderError) as caught:
        await send(stand_in, email("slow@example.com"), wait=0.3)

    assert caught.value.code == "timeout"
    assert request_outcome(caught.value) is RequestOutcome.TIMEOUT


async def test_only_resend_says_it_drops_repeated_sends(stand_in: StandIn) -> None:
    provider = provider_from_url(provider_url(stand_in))
    assert idempotency(provider) == ("true" if stand_in.service == "resend" else "false")
    assert KEY not in repr(provider)


async def test_resend_answers_a_repeated_delivery_key_without_sending_again() -> None:
    async with serve_stand_in("resend") as resend:
        first = await send(resend, email(key="otp:user-7:challenge-9"))
        again = await send(resend, email(key="otp:user-7:challenge-9"))

        assert again.provider_message_id == first.provider_message_id
        assert resend.delivered == ["ok@example.com"]


async def test_resend_refusing_a_reused_key_for_another_message_is_permanent() -> None:
    async with serve_stand_in("resend") as resend:
        await send(resend, email(key="otp:user-7:challenge-9"))
        changed = email(key="otp:user-7:challenge-9")
        changed = Email(**{**changed.__dict__, "subject": "Another subject"})

        with pytest.raises(PermanentProviderError) as caught:
            await send(resend, changed)

        assert caught.value.code == "resend_invalid_idempotent_request"
        assert resend.delivered == ["ok@example.com"]


async def test_the_sendgrid_key_may_come_from_its_usual_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENDGRID_API_KEY", KEY)
    async with serve_stand_in("sendgrid") as sendgrid:
        url = f"sendgrid://?endpoint={sendgrid.base}&from=no-reply%40example.com"
        provider = await started(url)
        try:
            await provider.send(email())
        finally:
            await provider.close()
        assert sendgrid.received[-1].headers["Authorization"] == f"Bearer {KEY}"


async def test_the_mailgun_key_may_come_from_a_mounted_secret_file(
    tmp_path: Any,
) -> None:
    secret = tmp_path / "api-key"
    secret.write_text(f"{KEY}\n")
    async with serve_stand_in("mailgun") as mailgun:
        url = (
            f"mailgun://eu/mg.example.com?endpoint={mailgun.base}&from=no-reply%40example.com"
            f"&token_file={secret}"
        )
        provider = await started(url)
        try:
            await provider.send(email())
        finally:
            await provider.close()
    expected = base64.b64encode(f"api:{KEY}".encode()).decode()
    assert mailgun.received[-1].headers["Authorization"] == f"Basic {expected}"


async def test_ses_without_any_credentials_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    provider = provider_from_url(
        "ses://eu-west-1?from=no-reply%40example.com&endpoint=http://127.0.0.1:9"
    )

    with pytest.raises(TransientProviderError) as caught:
        await provider.start()

    assert caught.value.code == "ses_credentials"
    await provider.close()


async def test_ses_requests_are_signed_by_the_sdk_for_the_region() -> None:
    async with serve_stand_in("ses") as ses:
        await send(ses, email())
        authorization = ses.received[-1].headers["Authorization"]

    assert authorization.startswith(f"AWS4-HMAC-SHA256 Credential={AWS_ACCESS_KEY_ID}/")
    assert "/eu-west-1/ses/aws4_request" in authorization
    assert AWS_SECRET_ACCESS_KEY not in str(ses.received[-1])
