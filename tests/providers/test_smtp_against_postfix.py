"""The SMTP provider's own client against Debian's Postfix, a server nobody here wrote.

The private instance (`support.postfix`) offers PIPELINING, 8BITMIME, SMTPUTF8, STARTTLS
with a certificate made for the run and SIZE, greylists on one port and hides PIPELINING on
another, hangs up on a client that writes past DATA before its 354, and delivers into a
Maildir. What arrives there is what a mailbox would hold, so every test reads its message
back from it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

import pytest

from leasebox.delivery.providers import (
    Email,
    PermanentProviderError,
    TransientProviderError,
    derived_message_id,
    provider_from_url,
)
from leasebox.delivery.providers.smtp import SmtpProvider
from support.postfix import SIZE_LIMIT, Postfix
from support.waiting import wait_for_async

CODE = "482913"
# The test's own prefix of every delivery key (`keyed`): each test runs on both event loops
# against the one Postfix of the session, and must find only its own messages there.
_RUN = {"prefix": ""}


@pytest.fixture(autouse=True)
def own_delivery_keys() -> None:
    _RUN["prefix"] = f"t{secrets.token_hex(4)}:"


def keyed(key: str) -> str:
    """`key` as this test sends it: after its own prefix."""
    return _RUN["prefix"] + key


def email(
    key: str,
    recipient: str = "ada@example.com",
    text: str = "",
    html: str | None = None,
    subject: str = "Your verification code",
) -> Email:
    return Email(
        outbox_id=1,
        kind="otp",
        aggregate_id="user-1",
        delivery_key=keyed(key),
        recipient=recipient,
        subject=subject,
        text=text or f"Your code is {CODE}.\n",
        html=html,
        attempt=1,
    )


@pytest.fixture(autouse=True)
def trusted_ca(postfix_server: Postfix, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker finds trusted CAs the way OpenSSL does; the test's CA is the one."""
    monkeypatch.setenv("SSL_CERT_FILE", str(postfix_server.certificates.ca_file))


async def started(url: str) -> SmtpProvider:
    provider = provider_from_url(url, timeout=10.0)
    assert isinstance(provider, SmtpProvider)
    await provider.start()
    return provider


@pytest.fixture
async def provider(postfix_server: Postfix) -> AsyncIterator[SmtpProvider]:
    provider = await started(postfix_server.url(pool_size=2))
    yield provider
    await provider.close()


async def arrived(server: Postfix, key: str, copies: int = 1) -> list[EmailMessage]:
    """The delivered messages of `key`, once `copies` arrived and nothing waits in the queue:
    then no other copy can still come."""

    def found() -> list[bytes] | None:
        delivered = server.delivered(keyed(key))
        return delivered if len(delivered) >= copies and server.queue_empty() else None

    raw = await wait_for_async(found, what=f"{copies} message(s) of {key} delivered")
    return [message_from_bytes(data, _class=EmailMessage, policy=policy.default) for data in raw]


def body_of(message: EmailMessage) -> str:
    content = text_part(message).get_content()
    assert isinstance(content, str)
    return content


def text_part(message: EmailMessage) -> Any:
    part = message.get_body(("plain",))
    assert part is not None
    return part


class RecordingTransport:
    """A connection's transport that keeps every write, to see what went out together."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def recorded(provider: SmtpProvider) -> RecordingTransport:
    [wire] = provider._idle
    recording = RecordingTransport(wire._transport)
    wire._transport = recording  # type: ignore[assignment]
    return recording


async def test_a_plain_send_arrives_in_the_mailbox_intact_and_exactly_once(
    postfix_server: Postfix, provider: SmtpProvider
) -> None:
    result = await provider.send(email("otp:plain:1", html=f"<p>Your code is <b>{CODE}</b></p>"))

    [message] = await arrived(postfix_server, "otp:plain:1")
    assert message["Delivered-To"] == "ada@example.com"
    assert message["Return-Path"] == "<no-reply@example.com>"
    assert message["To"] == "ada@example.com"
    assert message["Subject"] == "Your verification code"
    assert message["Message-ID"] == result.provider_message_id
    assert result.provider_message_id == derived_message_id(keyed("otp:plain:1"), "example.com")
    assert body_of(message) == f"Your code is {CODE}.\n"
    html = message.get_body(("html",))
    assert html is not None
    assert html.get_content() == f"<p>Your code is <b>{CODE}</b></p>\n"


async def test_many_sends_at_once_each_arrive_exactly_once(postfix_server: Postfix) -> None:
    provider = await started(postfix_server.url(pool_size=4))
    try:
        await asyncio.gather(*(provider.send(email(f"otp:many:{n}")) for n in range(20)))
    finally:
        await provider.close()

    for n in range(20):
        assert len(await arrived(postfix_server, f"otp:many:{n}")) == 1
    assert postfix_server.count(keyed("otp:many:")) == 20


async def test_the_envelope_goes_in_one_write_when_postfix_offers_pipelining(
    postfix_server: Postfix,
) -> None:
    logged = len(postfix_server.log())
    provider = await started(postfix_server.url(pool_size=1))
    try:
        recording = recorded(provider)
        for n in range(3):
            await provider.send(email(f"otp:pipelined:{n}"))
    finally:
        await provider.close()

    envelopes = [w for w in recording.writes if w.startswith(b"MAIL FROM:")]
    assert len(envelopes) == 3
    assert all(b"\r\nRCPT TO:<ada@example.com>\r\nDATA\r\n" in w for w in envelopes)
    for n in range(3):
        assert len(await arrived(postfix_server, f"otp:pipelined:{n}")) == 1
    assert "improper command pipelining" not in postfix_server.log()[logged:]


async def test_postfix_hangs_up_on_a_client_that_writes_the_message_before_the_354(
    postfix_server: Postfix,
) -> None:
    """What the pipelining tests rely on: Postfix notices and logs the breach."""
    reader, writer = await asyncio.open_connection("127.0.0.1", postfix_server.port)
    await reader.readline()
    writer.write(b"EHLO careless.example\r\n")
    while (await reader.readline())[3:4] != b" ":
        pass
    writer.write(
        b"MAIL FROM:<a@example.com>\r\nRCPT TO:<ada@example.com>\r\nDATA\r\n"
        b"Subject: too early\r\n\r\nhi\r\n.\r\n"
    )
    replies = [await reader.readline() for _ in range(3)]
    writer.close()

    assert replies[2].startswith(b"554 5.5.0")
    assert await reader.read() == b""
    await wait_for_async(
        lambda: "improper command pipelining after DATA" in postfix_server.log(),
        what="Postfix logging the breach",
    )


async def test_each_command_waits_for_its_reply_when_postfix_does_not_offer_pipelining(
    postfix_server: Postfix,
) -> None:
    logged = len(postfix_server.log())
    provider = await started(postfix_server.url(postfix_server.no_pipelining_port, pool_size=1))
    try:
        recording = recorded(provider)
        await provider.send(email("otp:unpipelined:1"))
    finally:
        await provider.close()

    commands = [w.split(b":")[0].strip() for w in recording.writes if len(w) < 200]
    assert commands[:3] == [b"MAIL FROM", b"RCPT TO", b"DATA"]
    assert len(await arrived(postfix_server, "otp:unpipelined:1")) == 1
    assert "improper command pipelining" not in postfix_server.log()[logged:]


async def test_a_subject_sender_and_body_in_other_scripts_arrive_intact_as_7bit(
    postfix_server: Postfix,
) -> None:
    sender = "Zoë Support <no-reply@example.com>"
    subject = "Votre code : vérifiez-le avant qu'il n'expire"
    text = "Votre code : 482913, il expire bientôt.\nВаш код 482913\n验证码 482913\n"  # noqa: RUF001
    provider = await started(postfix_server.url(sender=sender, pool_size=1))
    try:
        await provider.send(email("otp:8bit:1", text=text, subject=subject))
    finally:
        await provider.close()

    [message] = await arrived(postfix_server, "otp:8bit:1")
    assert body_of(message) == text
    assert message["Subject"] == subject
    assert message["From"] == sender
    assert text_part(message)["Content-Transfer-Encoding"] == "quoted-printable"
    [raw] = postfix_server.delivered(keyed("otp:8bit:1"))
    assert raw.isascii()  # 7-bit on the wire: no server needs 8BITMIME or SMTPUTF8 for it


async def test_an_internationalised_domain_arrives_at_its_ascii_form(
    postfix_server: Postfix, provider: SmtpProvider
) -> None:
    await provider.send(email("otp:idna:1", recipient="ada@bücher.example"))

    [message] = await arrived(postfix_server, "otp:idna:1")
    assert message["Delivered-To"] == "ada@xn--bcher-kva.example"
    assert message["To"] == "ada@xn--bcher-kva.example"


async def test_a_non_ascii_local_part_is_refused_before_a_byte_is_sent(
    postfix_server: Postfix, provider: SmtpProvider
) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(email("otp:utf8-local:1", recipient="jörg@example.com"))

    assert caught.value.code == "invalid_message"  # no header can hold it either
    await provider.send(email("otp:utf8-local:2"))  # the next message, on the same connection
    assert len(await arrived(postfix_server, "otp:utf8-local:2")) == 1
    assert postfix_server.delivered(keyed("otp:utf8-local:1")) == []


async def test_starttls_is_negotiated_with_a_verified_certificate(
    postfix_server: Postfix,
) -> None:
    provider = await started(postfix_server.url(starttls="true", pool_size=1))
    try:
        await provider.send(email("otp:tls:1"))
    finally:
        await provider.close()

    [message] = await arrived(postfix_server, "otp:tls:1")
    assert "using TLS" in str(message["Received"])


async def test_a_certificate_of_an_unknown_ca_is_refused_and_nothing_is_sent(
    postfix_server: Postfix, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(postfix_server.certificates.wrong_ca_file))
    refusals = postfix_server.log().count("SSL_accept error")
    provider = provider_from_url(postfix_server.url(starttls="true"), timeout=10.0)
    with pytest.raises(PermanentProviderError) as at_start:
        await provider.start()
    with pytest.raises(TransientProviderError) as at_send:  # a send never dead-letters on it
        await provider.send(email("otp:wrong-ca:1"))
    await provider.close()

    for caught in (at_start, at_send):
        assert caught.value.code == "tls"
        assert "unable to get local issuer certificate" in str(caught.value)
    await wait_for_async(
        lambda: postfix_server.log().count("SSL_accept error") >= refusals + 2,
        what="Postfix logging both refused handshakes",
    )
    assert postfix_server.queue_empty()
    assert postfix_server.delivered(keyed("otp:wrong-ca:1")) == []


async def test_a_message_over_the_size_limit_fails_permanently_with_postfix_s_552(
    postfix_server: Postfix, provider: SmtpProvider
) -> None:
    big = ("x" * 70 + "\n") * (SIZE_LIMIT // 70 + 100)
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(email("otp:big:1", text=big))
    await provider.send(email("otp:big:2"))  # the connection serves the next message

    assert caught.value.code == "smtp_552"
    assert "552 5.3.4 Message size exceeds fixed limit" in str(caught.value)
    assert len(await arrived(postfix_server, "otp:big:2")) == 1
    assert postfix_server.delivered(keyed("otp:big:1")) == []


async def test_greylisting_on_first_contact_is_transient_and_the_retry_is_delivered_once(
    postfix_server: Postfix,
) -> None:
    recipient = f"grey-{secrets.token_hex(4)}@example.com"  # a triple never seen before
    provider = await started(postfix_server.url(postfix_server.greylisting_port, pool_size=1))
    try:
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(email("otp:grey:1", recipient=recipient))
        await provider.send(email("otp:grey:1", recipient=recipient))
    finally:
        await provider.close()

    assert caught.value.code == "smtp_450"
    assert "Greylisted" in str(caught.value)
    assert postfix_server.policy.greylist.deferred(recipient) == 1
    assert len(await arrived(postfix_server, "otp:grey:1")) == 1


async def test_lines_that_start_with_a_dot_arrive_unchanged(
    postfix_server: Postfix, provider: SmtpProvider
) -> None:
    text = ".\n..\n.leading dot\n...three\nmiddle . dot\n.\n"
    await provider.send(email("otp:dots:1", text=text))

    [message] = await arrived(postfix_server, "otp:dots:1")
    assert body_of(message) == text
    [raw] = postfix_server.delivered(keyed("otp:dots:1"))
    assert raw.endswith(b"\n.\n..\n.leading dot\n...three\nmiddle . dot\n.\n")


async def test_a_line_over_998_characters_arrives_folded_by_quoted_printable(
    postfix_server: Postfix, provider: SmtpProvider
) -> None:
    long_line = "".join(f"{n:05d} " for n in range(400))  # 2,400 characters, no line end
    text = f"Your code is {CODE}.\n{long_line}\n.{long_line}\n"
    await provider.send(email("otp:long:1", text=text))

    [message] = await arrived(postfix_server, "otp:long:1")
    assert body_of(message) == text
    assert text_part(message)["Content-Transfer-Encoding"] == "quoted-printable"
    [raw] = postfix_server.delivered(keyed("otp:long:1"))
    body = raw.split(b"\n\n", 1)[1]
    assert max(map(len, body.split(b"\n"))) <= 76  # quoted-printable's soft line breaks
