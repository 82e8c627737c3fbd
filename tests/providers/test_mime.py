"""The MIME bytes written for SMTP parse back into what was rendered, within RFC 5322's line
limits and 7-bit clean, whatever script the subject and the body are in."""

from __future__ import annotations

import email
import re
from email.message import EmailMessage
from email.policy import default

import pytest

from leasebox.delivery.providers import Email, derived_message_id
from leasebox.delivery.providers.mime import build_mime, header

SENDER = "Example <no-reply@example.com>"


def message(
    subject: str = "Your code",
    text: str = "Code: 1234\n",
    html: str | None = None,
    key: str = "otp:user-1:c1",
) -> Email:
    return Email(1, "otp", "user-1", key, "ada@example.com", subject, text, html, 3)


def parsed(raw: bytes) -> EmailMessage:
    # As a receiving server stores it: with its own line ends.
    result = email.message_from_bytes(raw.replace(b"\r\n", b"\n"), policy=default)
    assert isinstance(result, EmailMessage)
    return result


def lines_of(raw: bytes) -> list[bytes]:
    assert b"\n" not in raw.replace(b"\r\n", b"")  # CRLF only, no bare LF
    return raw.split(b"\r\n")


SUBJECTS = [
    "Your verification code",
    "Ваш код подтверждения для входа в систему, действителен десять минут",
    "確認コードは次のとおりです。十分間有効です。" * 3,
    "a" * 120,
    "word " * 40,
    "emoji 🔐 and ascii mixed, long enough to need more than one encoded word at all",
]


@pytest.mark.parametrize("subject", SUBJECTS)
def test_a_subject_in_any_script_round_trips_within_the_line_limit(subject: str) -> None:
    raw = build_mime(message(subject=subject), SENDER, recipient="ada@example.com")

    assert raw.isascii()
    assert parsed(raw)["Subject"] == " ".join(subject.split())
    head = raw.split(b"\r\n\r\n", 1)[0]
    for line in lines_of(head):
        assert len(line) <= 998
        if len(line) > 78:  # only a word too long to fold at a space
            assert len(line.split(b": ", 1)[-1].strip().split(b" ")) == 1
    for word in re.findall(rb"=\?utf-8\?b\?[^?]*\?=", head):
        assert len(word) <= 75


@pytest.mark.parametrize(
    ("text", "encoding"),
    [
        ("Your code is 482913.\n", "7bit"),
        ("Ihr Code lautet 482913. Gültig für zehn Minuten.\n", "quoted-printable"),
        ("x" * 300 + "\nshort line\n", "quoted-printable"),
        ("ends without a newline", "7bit"),
        ("dots\n.\n..leading\nand = signs = here\n", "7bit"),
        ("tabs\tand trailing spaces   \nwindows\r\nline\rends\n", "7bit"),
        ("a bell \x07 rings\n", "quoted-printable"),
    ],
)
def test_a_text_body_round_trips_in_7bit_or_quoted_printable_lines(
    text: str, encoding: str
) -> None:
    raw = build_mime(message(text=text), SENDER, recipient="ada@example.com")

    assert raw.isascii()
    for line in lines_of(raw):
        assert len(line) <= 78
    got = parsed(raw)
    assert got.get_content_type() == "text/plain"
    assert got["Content-Transfer-Encoding"] == encoding
    expected = text.replace("\r\n", "\n").replace("\r", "\n")
    if not expected.endswith("\n"):
        expected += "\n"
    assert got.get_content() == expected


@pytest.mark.parametrize("tail", [" ", "\t", "  ", "é "])
@pytest.mark.parametrize("width", [*range(145, 152), 2400])
def test_quoted_printable_lines_stay_within_76_characters_when_a_space_ends_a_long_line(
    width: int, tail: str
) -> None:
    text = "".join(f"{n:05d} " for n in range(width))[:width] + tail + "\nnext\n"
    raw = build_mime(message(text=text), SENDER, recipient="ada@example.com")

    got = parsed(raw)
    assert got["Content-Transfer-Encoding"] == "quoted-printable"
    assert got.get_content() == text
    body = raw.split(b"\r\n\r\n", 1)[1]
    assert max(map(len, lines_of(body))) <= 76  # RFC 2045, 6.7


def test_html_is_a_multipart_alternative_beside_the_text() -> None:
    html = "<p>Ваш код: <b>482913</b></p>" + "<span>x</span>" * 30
    raw = build_mime(message(html=html), SENDER, recipient="ada@example.com")

    got = parsed(raw)
    assert got.get_content_type() == "multipart/alternative"
    text, rich = got.get_body(("plain",)), got.get_body(("html",))
    assert text is not None
    assert rich is not None
    assert text.get_content() == "Code: 1234\n"
    assert rich.get_content() == html + "\n"
    assert all(len(line) <= 78 for line in lines_of(raw))


@pytest.mark.parametrize(
    ("sender", "domain"),
    [
        ("Example <no-reply@Example.COM>", "example.com"),
        ("no-reply@mail.Example.org", "mail.example.org"),
        ("leasebox@localhost", "localhost"),
    ],
)
def test_the_message_ids_right_side_is_the_senders_domain(sender: str, domain: str) -> None:
    got = parsed(build_mime(message(key="otp:user-1:c7"), sender, recipient="ada@example.com"))
    left, at, right = str(got["Message-ID"]).strip("<>").partition("@")
    assert (len(left), at, right) == (32, "@", domain)


def test_the_headers_carry_the_delivery_key_and_its_message_id() -> None:
    raw = build_mime(message(key="otp:user-1:c7"), SENDER, recipient="ada@example.com")

    got = parsed(raw)
    assert got["Message-ID"] == derived_message_id("otp:user-1:c7", "example.com")
    assert got["X-Leasebox-Delivery-Key"] == "otp:user-1:c7"
    assert got["X-Leasebox-Attempt"] == "3"
    assert got["From"] == SENDER
    assert got["To"] == "ada@example.com"
    assert got["Auto-Submitted"] == "auto-generated"
    assert got["MIME-Version"] == "1.0"
    assert got["Date"].datetime is not None


def test_a_non_ascii_sender_name_and_delivery_key_are_encoded() -> None:
    raw = build_mime(
        message(key="otp:usér-1"), "Bücher <no-reply@example.com>", recipient="ada@example.com"
    )

    assert raw.isascii()
    got = parsed(raw)
    assert got["From"] == "Bücher <no-reply@example.com>"
    assert got["X-Leasebox-Delivery-Key"] == "otp:usér-1"


@pytest.mark.parametrize("recipient", ["adä@example.com", "ada @example.com", "a\r\nBcc: x@y"])
def test_a_recipient_that_cannot_be_a_header_is_refused(recipient: str) -> None:
    with pytest.raises(ValueError, match="recipient"):
        build_mime(message(), SENDER, recipient=recipient)


def test_a_short_plain_header_is_one_line() -> None:
    assert header("Subject", "Hi") == "Subject: Hi"
