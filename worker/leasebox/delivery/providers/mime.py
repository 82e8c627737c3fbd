"""The MIME message of one email, written straight to bytes for the common case.

`email.message.EmailMessage` parses every header it is given back into a token tree and
refolds it on output, which cost about a millisecond of CPU per message: more than
everything else a worker does for an SMTP send. What leasebox sends is always the same
shape (a handful of known headers, a text part, optionally an HTML alternative), so this
module writes that shape directly:

- every line ends in CRLF and stays within RFC 5322's limits: headers are folded at spaces
  to 78 characters where they can be, bodies are 7bit only when pure ASCII with short lines
  and quoted-printable otherwise (`binascii.b2a_qp`, soft line breaks at 76);
- a header value that is not printable ASCII (a subject in another script, a delivery key
  with a non-ASCII character) becomes RFC 2047 encoded-words (UTF-8, base64), each at most
  75 characters and never splitting a character;
- the output is 7-bit clean, so no server needs 8BITMIME or SMTPUTF8 for it.

A recipient that is not printable ASCII without spaces (only a row written by hand gets
that far: `OutboxMessage` refuses it) is a `ValueError`, as it was for `EmailMessage`.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from datetime import UTC, datetime
from email.utils import format_datetime, formataddr, parseaddr
from functools import lru_cache

from leasebox.delivery.providers.base import Email, derived_message_id, sender_domain

MAX_LINE = 78
# What a 7bit body may hold: printable ASCII, tabs and line ends (control characters are
# left to quoted-printable).
_SEVEN_BIT = bytes(range(0x20, 0x7F)) + b"\t\r\n"
# The longest payload of an encoded-word: 75 characters less `=?utf-8?b?` and `?=` is 63,
# and base64 turns 45 bytes into 60 characters.
_WORD_BYTES = 45
_WORD_PREFIX = "=?utf-8?b?"


def _plain(value: str) -> bool:
    """Printable ASCII (spaces allowed): what a header may carry as it is."""
    return value.isascii() and value.isprintable()


def _encoded_words(value: str, first: int = _WORD_BYTES) -> list[str]:
    """`value` as RFC 2047 encoded-words, none longer than 75 characters, none splitting a
    character's UTF-8 bytes; the first holds at most `first` bytes (it shares its line with
    the header's name)."""
    words: list[str] = []
    chunk: list[bytes] = []
    size = 0
    limit = first
    for char in value:
        encoded = char.encode("utf-8", "replace")
        if size + len(encoded) > limit and chunk:
            words.append(_word(b"".join(chunk)))
            chunk, size, limit = [], 0, _WORD_BYTES
        chunk.append(encoded)
        size += len(encoded)
    if chunk:
        words.append(_word(b"".join(chunk)))
    return words


def _word(raw: bytes) -> str:
    return f"{_WORD_PREFIX}{base64.b64encode(raw).decode('ascii')}?="


def header(name: str, value: str) -> str:
    """One header, folded (CRLF and a space) so that lines stay within 78 characters where
    a space allows it; encoded-words when the value is not printable ASCII."""
    if _plain(value):
        line = f"{name}: {value}"
        if len(line) <= MAX_LINE:
            return line
        pieces = value.split(" ")
        if max(len(p) for p in pieces) + 1 <= 998 - len(name) - 2:
            return _fold(name, pieces)
    # Bytes that fit the first line beside `Name: ` once encoded (4 characters per 3 bytes).
    first = (MAX_LINE - len(name) - 2 - len(_WORD_PREFIX) - 2) // 4 * 3
    return _fold(name, _encoded_words(value, max(first, 3)))


def _fold(name: str, pieces: list[str]) -> str:
    lines: list[str] = []
    current = f"{name}:"
    for piece in pieces:
        if len(current) + 1 + len(piece) > MAX_LINE and current != f"{name}:":
            lines.append(current)
            current = ""
        current = f"{current} {piece}"
    lines.append(current)
    return "\r\n".join(lines)


@lru_cache(maxsize=16)
def sender_header(sender: str) -> str:
    """The From header of a configured sender (`Name <address>` or an address), computed
    once: a display name that is not ASCII is encoded."""
    name, address = parseaddr(sender)
    if _plain(sender):
        return header("From", sender)
    return header("From", formataddr((name, address), charset="utf-8"))


def _date(now: datetime | None) -> str:
    """The Date header's value; the clock's current second is formatted once."""
    if now is not None:
        return format_datetime(now)
    second = int(time.time())
    text = _DATES.get(second)
    if text is None:
        _DATES.clear()
        text = _DATES[second] = format_datetime(datetime.fromtimestamp(second, UTC))
    return text


_DATES: dict[int, str] = {}


def _body(text: str) -> tuple[str, bytes]:
    """(transfer encoding, the body in wire form: CRLF line ends and a final line end)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text and text[-1] != "\n":
        text += "\n"
    if text.isascii():
        wire = text.replace("\n", "\r\n").encode("ascii")
        if _short_lines(text) and not wire.translate(None, _SEVEN_BIT):
            return "7bit", wire
    else:
        wire = text.replace("\n", "\r\n").encode("utf-8", "replace")
    # With CRLF line ends in, b2a_qp writes CRLF line ends (soft breaks too) out.
    encoded = binascii.b2a_qp(wire, quotetabs=False, istext=True, header=False)
    if b"=20\r\n" in encoded or b"=09\r\n" in encoded:
        encoded = _within_76(encoded)
    return "quoted-printable", encoded


def _within_76(encoded: bytes) -> bytes:
    """`encoded` with every line at most 76 characters, as RFC 2045 (6.7) requires.

    b2a_qp breaks a long line at 75 characters and a soft `=`, but a space or tab that ends
    a line becomes `=20` or `=09` after that check: a line then ends 77 characters long.
    Such a line gets one more soft break, before its last escape.
    """
    lines = encoded.split(b"\r\n")
    for n, line in enumerate(lines):
        if len(line) > 76 and line[-3:-2] == b"=":
            lines[n] = line[:-3] + b"=\r\n" + line[-3:]
    return b"\r\n".join(lines)


def _short_lines(text: str) -> bool:
    return max(map(len, text.split("\n"))) <= MAX_LINE


_PART_HEADERS = {
    (subtype, encoding): (
        f'Content-Type: text/{subtype}; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    ).encode("ascii")
    for subtype in ("plain", "html")
    for encoding in ("7bit", "quoted-printable")
}


def _message_id(email: Email, sender: str) -> str:
    return derived_message_id(email.delivery_key, sender_domain(sender))


def build_mime(
    email: Email,
    sender: str,
    *,
    recipient: str,
    message_id: str | None = None,
    now: datetime | None = None,
) -> bytes:
    """The message for `email` as SMTP DATA: headers, the text part and, when the email
    has HTML, a multipart/alternative of both. `recipient` is the address on the wire;
    `message_id` is the one derived from the delivery key, when the caller has it already."""
    if not recipient.isascii() or not recipient.isprintable() or " " in recipient:
        raise ValueError("the recipient is not an address that can be sent")
    head = [
        sender_header(sender),
        header("To", recipient),
        header("Subject", " ".join(email.subject.split())),
        f"Date: {_date(now)}",
        f"Message-ID: {message_id or _message_id(email, sender)}",
        header("X-Leasebox-Delivery-Key", email.delivery_key),
        f"X-Leasebox-Attempt: {email.attempt}",
        "Auto-Submitted: auto-generated",
        "MIME-Version: 1.0",
    ]
    text_encoding, text = _body(email.text)
    top = ("\r\n".join(head) + "\r\n").encode("ascii")
    if email.html is None:
        return top + _PART_HEADERS["plain", text_encoding] + text
    html_encoding, html = _body(email.html)
    boundary = f"=_{secrets.token_hex(16)}".encode("ascii")
    while boundary in text or boundary in html:  # only a 7bit part could hold it
        boundary = f"=_{secrets.token_hex(16)}".encode("ascii")
    return b"".join(
        (
            top,
            b'Content-Type: multipart/alternative;\r\n boundary="%s"\r\n\r\n--%s\r\n'
            % (boundary, boundary),
            _PART_HEADERS["plain", text_encoding],
            text,
            # The line end before a boundary belongs to the boundary (RFC 2046), not the part.
            b"\r\n--%s\r\n" % boundary,
            _PART_HEADERS["html", html_encoding],
            html,
            b"\r\n--%s--\r\n" % boundary,
        )
    )
