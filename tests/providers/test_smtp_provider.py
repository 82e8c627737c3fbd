"""The SMTP provider against a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from leasebox.delivery.providers import (
    Email,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
    derived_message_id,
    provider_from_url,
)
from leasebox.delivery.providers.smtp import SmtpProvider
from leasebox.errors import AmbiguousProviderError, MessageExpired
from leasebox.testing.ports import free_port
from support.mail_servers import SMTP_PASSWORD, SMTP_USER, SmtpServer

CODE = "482913"


def email(
    recipient: str = "ada@example.com",
    key: str = "otp:user-1:c1",
    n: int = 1,
    expired: Callable[[], bool] = lambda: False,
) -> Email:
    return Email(
        outbox_id=n,
        kind="otp",
        aggregate_id="user-1",
        delivery_key=key,
        recipient=recipient,
        subject="Your verification code",
        text=f"Your code is {CODE}.\n",
        html=f"<p>Your code is <b>{CODE}</b>.</p>",
        attempt=1,
        expired=expired,
    )


def smtp(url: str) -> SmtpProvider:
    provider = provider_from_url(url, timeout=5.0)
    assert isinstance(provider, SmtpProvider)
    return provider


@pytest.fixture
async def provider(smtp_server: SmtpServer) -> AsyncIterator[SmtpProvider]:
    provider = smtp(smtp_server.url("from=Example%20%3Cno-reply%40example.com%3E"))
    await provider.start()
    yield provider
    await provider.close()


async def test_a_delivered_message_carries_the_derived_message_id_and_headers(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    result = await provider.send(email())

    [delivered] = smtp_server.handler.delivered
    message = delivered.message
    assert delivered.mail_from == "no-reply@example.com"
    assert delivered.rcpt_tos == ["ada@example.com"]
    assert message["Message-ID"] == derived_message_id("otp:user-1:c1", "example.com")
    assert result.provider_message_id == message["Message-ID"]
    assert message["X-Leasebox-Delivery-Key"] == "otp:user-1:c1"
    assert message["From"] == "Example <no-reply@example.com>"
    assert message["To"] == "ada@example.com"
    assert message["Subject"] == "Your verification code"
    assert message["Auto-Submitted"] == "auto-generated"
    assert message["Date"] is not None
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None
    assert html is not None
    assert CODE in text.get_content()
    assert f"<b>{CODE}</b>" in html.get_content()


async def test_an_internationalised_domain_is_written_in_its_ascii_form_and_the_rest_as_given(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    await provider.send(email(recipient="Ada.Lovelace@Bücher.de"))

    [delivered] = smtp_server.handler.delivered
    assert delivered.rcpt_tos == ["Ada.Lovelace@xn--bcher-kva.de"]
    assert delivered.message["To"] == "Ada.Lovelace@xn--bcher-kva.de"


async def test_a_retry_of_the_same_delivery_key_has_the_same_message_id(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    first = await provider.send(email(key="otp:user-1:c9", n=1))
    second = await provider.send(email(key="otp:user-1:c9", n=1))
    other = await provider.send(email(key="otp:user-1:c10", n=2))

    assert first == second
    assert other != first
    ids = [d.message["Message-ID"] for d in smtp_server.handler.delivered]
    assert ids[0] == ids[1] != ids[2]


async def test_a_text_only_email_is_sent_as_a_single_plain_part(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    plain = Email(1, "otp", None, "k1", "ada@example.com", "Hi", "just text\n", None, 1)

    await provider.send(plain)

    message = smtp_server.handler.delivered[0].message
    assert message.get_content_type() == "text/plain"
    assert message.get_content().splitlines() == ["just text"]


@pytest.mark.parametrize(
    ("recipient", "code"),
    [
        ("reject550@example.com", "smtp_550"),
        ("reject553@example.com", "smtp_553"),
        ("spam554@example.com", "smtp_554"),
    ],
)
async def test_a_5xx_reply_is_a_permanent_error_without_the_address(
    provider: SmtpProvider, smtp_server: SmtpServer, recipient: str, code: str
) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(email(recipient=recipient))

    assert caught.value.code == code
    assert caught.value.permanence == "permanent"
    assert f"127.0.0.1:{smtp_server.port}" in str(caught.value)
    assert recipient not in str(caught.value)
    assert CODE not in str(caught.value)
    assert smtp_server.handler.delivered == []


async def test_a_refused_sender_is_a_permanent_error(smtp_server: SmtpServer) -> None:
    provider = smtp(smtp_server.url("from=bounce553%40example.com"))

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(email())
    await provider.close()

    assert caught.value.code == "smtp_553"
    assert "rejected the message" in str(caught.value)


@pytest.mark.parametrize(
    ("recipient", "code"),
    [("defer451@example.com", "smtp_451"), ("shutdown421@example.com", "smtp_421")],
)
async def test_a_4xx_reply_is_a_transient_error(
    provider: SmtpProvider, recipient: str, code: str
) -> None:
    with pytest.raises(TransientProviderError) as caught:
        await provider.send(email(recipient=recipient))

    assert caught.value.code == code
    assert caught.value.permanence == "transient"


async def test_the_connection_still_delivers_after_a_refused_recipient(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    with pytest.raises(PermanentProviderError):
        await provider.send(email(recipient="reject550@example.com"))
    await provider.send(email())

    assert [d.rcpt_tos for d in smtp_server.handler.delivered] == [["ada@example.com"]]


@pytest.mark.parametrize(
    "message",
    [email(), dataclasses.replace(email(), html=None, text="line\rends\r\nof\nevery kind\n\n")],
)
async def test_the_size_announced_in_mail_from_is_the_size_of_the_message_received(
    provider: SmtpProvider, smtp_server: SmtpServer, message: Email
) -> None:
    await provider.send(message)

    [delivered] = smtp_server.handler.delivered
    assert delivered.octets > 0
    assert delivered.mail_options == [f"SIZE={delivered.octets}"]


async def test_a_connection_the_server_dropped_is_replaced_without_an_error(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    smtp_server.handler.drop_after_data = True

    for n in range(3):
        await provider.send(email(key=f"k{n}", n=n))

    sessions = {d.session_id for d in smtp_server.handler.delivered}
    assert len(smtp_server.handler.delivered) == 3
    assert len(sessions) == 3


async def test_an_unreachable_server_is_transient_with_a_clear_message() -> None:
    port = free_port()  # nothing listens here once the probe socket is closed
    provider = smtp(f"smtp://{SMTP_USER}:{SMTP_PASSWORD}@127.0.0.1:{port}")

    with pytest.raises(TransientProviderError) as at_start:
        await provider.start()
    with pytest.raises(TransientProviderError) as at_send:
        await provider.send(email())
    reason = await provider.check()
    await provider.close()

    for error in (at_start.value, at_send.value):
        assert error.code == "connection"
        assert f"smtp://127.0.0.1:{port} is unreachable" in str(error)
        assert SMTP_PASSWORD not in str(error)
    assert reason is not None
    assert "unreachable" in reason


async def test_bad_credentials_at_start_are_a_permanent_error_naming_the_user(
    smtp_server: SmtpServer,
) -> None:
    provider = smtp(smtp_server.url(userinfo=f"{SMTP_USER}:wrong-password"))

    with pytest.raises(PermanentProviderError) as caught:
        await provider.start()
    await provider.close()

    assert caught.value.code == "smtp_auth"
    assert "rejected the credentials of user 'leasebox'" in str(caught.value)
    assert "wrong-password" not in str(caught.value)
    assert "wrong-password" not in repr(provider)


async def test_bad_credentials_during_a_send_are_transient_so_the_queue_survives(
    smtp_server: SmtpServer,
) -> None:
    provider = smtp(smtp_server.url(userinfo=f"{SMTP_USER}:wrong-password"))

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(email())
    await provider.close()

    assert caught.value.code == "smtp_auth"


async def test_good_credentials_log_in_and_deliver(smtp_server: SmtpServer) -> None:
    provider = smtp(smtp_server.url(userinfo=f"{SMTP_USER}:{SMTP_PASSWORD}"))
    await provider.start()
    try:
        await provider.send(email())
        assert await provider.check() is None
    finally:
        await provider.close()

    assert len(smtp_server.handler.delivered) == 1


async def test_a_server_that_never_confirms_the_message_in_time_is_an_ambiguous_outcome(
    smtp_server: SmtpServer,
) -> None:
    smtp_server.handler.slow_seconds = 30.0  # cancelled when the server stops
    provider = smtp(smtp_server.url("timeout=1"))
    await provider.start()
    try:
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(email(recipient="slow@example.com"))
        await provider.send(email())  # the timed-out connection is not reused
    finally:
        await provider.close()

    # The server had the whole message when the reply timed out: it may deliver it.
    assert isinstance(caught.value, AmbiguousProviderError)
    assert caught.value.code == "ambiguous"
    assert "did not confirm the message in time" in str(caught.value)
    assert len(smtp_server.handler.delivered) == 1


async def test_thirty_two_concurrent_sends_are_all_delivered_over_a_small_pool(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    keys = [f"otp:user-{n}:c" for n in range(32)]

    results = await asyncio.gather(*(provider.send(email(key=k, n=i)) for i, k in enumerate(keys)))

    delivered = smtp_server.handler.delivered
    assert len(delivered) == 32
    assert {d.message["X-Leasebox-Delivery-Key"] for d in delivered} == set(keys)
    assert {r.provider_message_id for r in results} == {
        derived_message_id(k, "example.com") for k in keys
    }
    assert len({d.session_id for d in delivered}) <= provider.settings.pool_size


async def test_starttls_upgrades_the_connection_when_asked(
    smtp_starttls_server: SmtpServer,
) -> None:
    provider = smtp(smtp_starttls_server.url("starttls=true&tls_verify=false"))
    await provider.start()
    try:
        await provider.send(email())
    finally:
        await provider.close()

    assert len(smtp_starttls_server.handler.delivered) == 1


async def test_an_unverifiable_certificate_fails_start_with_a_tls_error(
    smtp_starttls_server: SmtpServer,
) -> None:
    provider = smtp(smtp_starttls_server.url("starttls=true"))

    with pytest.raises(PermanentProviderError) as caught:
        await provider.start()
    await provider.close()

    assert caught.value.code == "tls"
    assert "certificate" in str(caught.value)


async def test_a_server_that_requires_starttls_refuses_a_plain_session(
    smtp_starttls_server: SmtpServer,
) -> None:
    provider = smtp(smtp_starttls_server.url("starttls=false"))
    await provider.start()  # the greeting and EHLO work without TLS

    with pytest.raises(ProviderError) as caught:
        await provider.send(email())
    await provider.close()

    assert caught.value.code.startswith("smtp_5")


async def test_a_closed_provider_refuses_to_send(provider: SmtpProvider) -> None:
    await provider.close()

    with pytest.raises(TransientProviderError):
        await provider.send(email())
    assert await provider.check() == "the SMTP provider is closed"


async def test_an_expired_otp_opens_no_envelope(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    with pytest.raises(MessageExpired):
        await provider.send(email(expired=lambda: True))
    await provider.send(email(key="otp:user-1:c2"))

    assert smtp_server.handler.senders == ["no-reply@example.com"]  # the second message's
    assert len(smtp_server.handler.delivered) == 1


async def test_an_otp_that_expires_while_its_envelope_is_answered_is_never_written(
    provider: SmtpProvider, smtp_server: SmtpServer
) -> None:
    def expired_once_the_server_has_the_recipient() -> bool:
        return bool(smtp_server.handler.recipients)

    with pytest.raises(MessageExpired):
        await provider.send(email(expired=expired_once_the_server_has_the_recipient))
    smtp_server.handler.recipients.clear()
    await provider.send(email(key="otp:user-1:c2"))

    [delivered] = smtp_server.handler.delivered
    assert delivered.message["X-Leasebox-Delivery-Key"] == "otp:user-1:c2"
