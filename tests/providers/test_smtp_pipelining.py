"""The SMTP provider against a server that offers PIPELINING, and one that does not, on
loopback (`support.pipelining_smtp`): the envelope in one write when the server allows it,
one command at a time when it does not, and every reply of a pipelined group heeded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from email import message_from_bytes, policy

import pytest

from leasebox.delivery.providers import (
    Email,
    PermanentProviderError,
    TransientProviderError,
    derived_message_id,
    provider_from_url,
)
from leasebox.delivery.providers.smtp import SmtpProvider
from leasebox.errors import AmbiguousProviderError, MessageExpired
from support.pipelining_smtp import PipeliningServer, pipelining_smtp

CODE = "482913"


def email(
    recipient: str = "ada@example.com",
    key: str = "otp:user-1:c1",
    expired: Callable[[], bool] = lambda: False,
) -> Email:
    return Email(
        outbox_id=1,
        kind="otp",
        aggregate_id="user-1",
        delivery_key=key,
        recipient=recipient,
        subject="Your verification code",
        text=f"Your code is {CODE}.\n.\n.leading dot\n",
        html=f"<p>Your code is <b>{CODE}</b>.</p>",
        attempt=1,
        expired=expired,
    )


@pytest.fixture(params=[True, False], ids=["pipelining", "no pipelining"])
def server(request: pytest.FixtureRequest) -> Iterator[PipeliningServer]:
    with pipelining_smtp(PipeliningServer(pipelining=request.param)) as running:
        yield running


@pytest.fixture
def pipelined() -> Iterator[PipeliningServer]:
    with pipelining_smtp(PipeliningServer(pipelining=True)) as running:
        yield running


async def started(url: str) -> SmtpProvider:
    provider = provider_from_url(url, timeout=2.0)
    assert isinstance(provider, SmtpProvider)
    await provider.start()
    return provider


@pytest.fixture
async def provider(server: PipeliningServer) -> AsyncIterator[SmtpProvider]:
    provider = await started(server.url("pool_size=1&from=no-reply%40example.com"))
    yield provider
    await provider.close()


async def test_a_server_that_offers_pipelining_gets_the_envelope_in_one_write(
    pipelined: PipeliningServer,
) -> None:
    provider = await started(pipelined.url("pool_size=1"))
    try:
        for n in range(3):
            await provider.send(email(key=f"otp:user-1:c{n}"))
    finally:
        await provider.close()

    assert pipelined.transaction_reads() == [["MAIL", "RCPT", "DATA"]] * 3
    assert pipelined.early == []  # the message waited for the 354
    assert len(pipelined.received) == 3


async def test_a_server_without_pipelining_gets_one_command_per_reply() -> None:
    with pipelining_smtp(PipeliningServer(pipelining=False)) as server:
        provider = await started(server.url("pool_size=1"))
        try:
            for n in range(3):
                await provider.send(email(key=f"otp:user-1:c{n}"))
        finally:
            await provider.close()

    assert server.unasked == []
    assert server.transaction_reads() == [["MAIL"]] * 3
    assert len(server.received) == 3


async def test_the_message_arrives_whole_with_its_size_announced(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    result = await provider.send(email())

    [received] = server.received
    assert received.mail_from == "no-reply@example.com"
    assert received.recipients == ("ada@example.com",)
    assert received.mail_options == (f"SIZE={len(received.content)}",)
    parsed = message_from_bytes(received.content.replace(b"\r\n", b"\n"), policy=policy.default)
    assert (
        parsed["Message-ID"]
        == derived_message_id("otp:user-1:c1", "example.com")
        == result.provider_message_id
    )
    text = parsed.get_body(("plain",))
    assert text is not None
    assert text.get_content() == f"Your code is {CODE}.\n.\n.leading dot\n"


async def test_a_refused_recipient_is_permanent_and_the_connection_serves_the_next_message(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(email(recipient="reject550@example.com"))
    await provider.send(email())

    assert caught.value.code == "smtp_550"
    assert "refused the recipient" in str(caught.value)
    assert "reject550" not in str(caught.value)
    assert [r.recipients for r in server.received] == [("ada@example.com",)]
    assert len(server.sessions) == 1


async def test_a_deferred_recipient_is_transient(provider: SmtpProvider) -> None:
    with pytest.raises(TransientProviderError) as caught:
        await provider.send(email(recipient="defer451@example.com"))

    assert caught.value.code == "smtp_451"


async def test_a_refused_sender_is_the_outcome_not_the_replies_that_follow_from_it(
    server: PipeliningServer,
) -> None:
    provider = await started(server.url("pool_size=1&from=bounce553%40example.com"))
    try:
        with pytest.raises(PermanentProviderError) as caught:
            await provider.send(email())
    finally:
        await provider.close()

    assert caught.value.code == "smtp_553"  # not the 503 to RCPT nor the 554 to DATA
    assert server.received == []


async def test_data_accepted_after_a_refused_recipient_ends_an_empty_message(
    pipelined: PipeliningServer,
) -> None:
    pipelined.lenient_data = True
    provider = await started(pipelined.url("pool_size=1"))
    try:
        with pytest.raises(PermanentProviderError) as caught:
            await provider.send(email(recipient="reject550@example.com"))
        await provider.send(email())
    finally:
        await provider.close()

    assert caught.value.code == "smtp_550"
    assert pipelined.unaddressed == [b""]  # a lone dot, as RFC 2920 asks: nothing was sent
    assert [r.recipients for r in pipelined.received] == [("ada@example.com",)]
    assert len(pipelined.sessions) == 1


async def test_a_drop_before_the_message_on_an_idle_connection_gets_one_fresh_try(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    server.drop_groups = 1

    await provider.send(email())

    assert len(server.received) == 1
    assert [r.session for r in server.received] == [2]


async def test_a_drop_after_the_whole_message_is_ambiguous_and_not_resent(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    server.drop_after_message = True

    with pytest.raises(AmbiguousProviderError):
        await provider.send(email())

    assert len(server.received) == 1


async def test_no_answer_to_data_is_a_timeout_with_nothing_sent(server: PipeliningServer) -> None:
    server.stall = True
    provider = await started(server.url("pool_size=1&timeout=0.3"))
    try:
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(email())
    finally:
        await provider.close()

    assert not isinstance(caught.value, AmbiguousProviderError)
    assert caught.value.code == "timeout"
    assert server.received == []


async def test_an_otp_that_expires_while_its_envelope_is_answered_is_never_written(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    # The clock runs out between the check before the envelope and the 354: the message
    # must not follow the DATA that the server accepted.
    with pytest.raises(MessageExpired):
        await provider.send(email(expired=server.rcpt_seen.is_set))
    server.rcpt_seen.clear()
    await provider.send(email(key="otp:user-1:c2"))

    assert [
        r.content.count(b"X-Leasebox-Delivery-Key: otp:user-1:c2") for r in server.received
    ] == [1]
    assert server.unaddressed == []


async def test_an_expired_otp_opens_no_envelope_and_keeps_the_connection(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    with pytest.raises(MessageExpired):
        await provider.send(email(expired=lambda: True))
    await provider.send(email(key="otp:user-1:c2"))

    assert server.transaction_reads() == (
        [["MAIL", "RCPT", "DATA"]] if server.pipelining else [["MAIL"]]
    )
    assert len(server.sessions) == 1


async def test_a_reply_nobody_asked_for_retires_the_connection(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    server.say(b"421 4.4.2 idle too long\r\n")
    assert await asyncio.to_thread(server.sessions[0].ended.wait, 5)  # the client hung up

    await provider.send(email())

    assert [r.session for r in server.received] == [2]


async def test_thirty_two_concurrent_sends_share_the_pool(server: PipeliningServer) -> None:
    provider = await started(server.url("pool_size=4"))
    keys = [f"otp:user-{n}:c" for n in range(32)]
    try:
        await asyncio.gather(*(provider.send(email(key=k)) for k in keys))
    finally:
        await provider.close()

    assert len(server.received) == 32
    assert len(server.sessions) <= 4
    assert server.early == []
    assert server.unasked == []


async def test_a_reply_beyond_the_ones_asked_for_is_unreadable_not_paired_with_the_next_command(
    server: PipeliningServer, provider: SmtpProvider
) -> None:
    server.extra_reply = b"550 5.1.1 not for RCPT\r\n"

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(email())

    assert caught.value.code == "smtp_invalid_reply"
    assert server.received == []
