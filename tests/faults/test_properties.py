"""Properties over everything a provider can say and everything a producer can send.

Hypothesis generates the replies (status, headers, bodies, SMTP reply lines: any bytes) that
the real providers read from the hostile servers, and the message fields a producer hands to
`OutboxMessage`. Whatever it finds, the outcome is classified by the documented table, every
text that reaches the database is storable and bounded, and a message that validates is
written by PostgreSQL without a complaint.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasebox import InvalidMessage, OutboxMessage, enqueue
from leasebox.delivery.boundary import MAX_MESSAGE_ID_LENGTH, Accepted, accepted, send_once
from leasebox.delivery.providers import Email, provider_from_url
from leasebox.delivery.providers.base import MAX_ERROR_LENGTH, SendResult, derived_message_id
from leasebox.delivery.retrying import MAX_CODE_LENGTH, Failure, classify
from leasebox.errors import PermanentProviderError, TransientProviderError
from leasebox.producer.payload_crypto import PayloadCipher, generate_key
from support import hostile_http as http
from support import hostile_smtp as smtp
from support.outbox_rows import insert_message

ANY_CHARACTER = st.characters(exclude_categories=())
HOSTILE_TEXT = st.one_of(
    st.text(ANY_CHARACTER, max_size=300),
    st.builds(
        lambda c, n: c * n, st.text(ANY_CHARACTER, min_size=1, max_size=3), st.integers(0, 400_000)
    ),
)
EXAMPLES = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def storable(text: str | None, limit: int) -> bool:
    if text is None:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text and len(text) <= limit


def email(n: int) -> Email:
    return Email(
        outbox_id=n,
        kind="otp",
        aggregate_id="user-1",
        delivery_key=f"otp:property-{n}",
        recipient="ada@example.com",
        subject="Your code",
        text="Your code is 493817",
        html=None,
        attempt=1,
    )


def check_failure(failure: Failure) -> None:
    assert storable(failure.detail, MAX_ERROR_LENGTH)
    assert re.fullmatch(f"[a-z0-9_]{{1,{MAX_CODE_LENGTH}}}", failure.code), failure.code
    assert failure.retry_after is None or 0 < failure.retry_after < float("inf")


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as opened:
        yield opened


# -- whatever a provider returns or raises -----------------------------------------------------


@EXAMPLES
@given(
    message_id=st.one_of(st.none(), HOSTILE_TEXT, st.integers()), warning=st.none() | HOSTILE_TEXT
)
def test_an_acceptance_keeps_only_a_storable_bounded_id(
    message_id: Any, warning: str | None
) -> None:
    result = accepted(SendResult(message_id, warning=warning))
    assert storable(result.provider_message_id, MAX_MESSAGE_ID_LENGTH)
    assert all(storable(w, 10_000) for w in result.warnings)


@EXAMPLES
@given(
    code=st.one_of(HOSTILE_TEXT, st.none(), st.integers()),
    text=HOSTILE_TEXT,
    retry_after=st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-5, 10**9)),
    permanent=st.booleans(),
)
def test_a_failure_keeps_only_a_bounded_label_a_storable_line_and_real_seconds(
    code: Any, text: str, retry_after: Any, permanent: bool
) -> None:
    kind = PermanentProviderError if permanent else TransientProviderError
    failure = classify(kind(code, text, retry_after=retry_after))
    check_failure(failure)
    assert failure.transient is not permanent


@EXAMPLES
@given(message_id=HOSTILE_TEXT, text=HOSTILE_TEXT, code=HOSTILE_TEXT)
def test_what_the_boundary_keeps_is_written_by_postgresql(
    db_conn: psycopg.Connection[Any], message_id: str, text: str, code: str
) -> None:
    kept = accepted(SendResult(message_id)).provider_message_id
    failure = classify(TransientProviderError(code, text))
    # A provider's id goes to the `sent` history row, a failure's text to the queue row.
    common = {"kind": "otp", "recipient": "a@example.com", "template": "otp"}
    insert_message(db_conn, status="sent", provider_message_id=kept, delivery_key="k1", **common)
    insert_message(
        db_conn,
        status="dead",
        last_error=failure.detail,
        last_error_class=failure.code,
        delivery_key="k2",
        **common,
    )
    db_conn.rollback()


# -- whatever an HTTP API answers --------------------------------------------------------------

HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60)


@st.composite
def http_replies(draw: st.DrawFn) -> tuple[int, bytes]:
    status = draw(st.integers(200, 599))
    body = draw(st.binary(max_size=2000) | st.builds(lambda n: b"9" * n, st.integers(0, 200_000)))
    if status in (204, 304):  # HTTP forbids them a body; a client may drop the connection
        body = b""
    headers = [f"Content-Length: {len(body)}", "Connection: close"]
    if draw(st.booleans()):
        headers.append(f"Retry-After: {draw(HEADER_TEXT).strip()}")
    if draw(st.booleans()):
        headers.append(f"X-Message-Id: {draw(HEADER_TEXT).strip()}")
    head = f"HTTP/1.1 {status} Whatever\r\n" + "\r\n".join(headers) + "\r\n\r\n"
    return status, head.encode("latin-1") + body


def test_every_http_reply_is_classified_by_its_status_and_kept_storable(
    runner: asyncio.Runner,
) -> None:
    script = http.Script(reply=lambda key, nth: http.RAW)
    with http.hostile_http(script) as server:
        provider = provider_from_url(server.url(), timeout=5.0)
        runner.run(provider.start())
        counter = iter(range(10**9))

        @EXAMPLES
        @given(reply=http_replies())
        def check(reply: tuple[int, bytes]) -> None:
            status, script.raw = reply
            outcome = runner.run(send_once(provider, email(next(counter))))
            if 200 <= status < 300:
                assert isinstance(outcome, Accepted)
                assert storable(outcome.provider_message_id, MAX_MESSAGE_ID_LENGTH)
                return
            assert isinstance(outcome, Failure)
            check_failure(outcome)
            assert outcome.code == f"http_{status}"
            retried = status in (401, 403, 408, 429) or status >= 500 or status < 400
            assert outcome.transient is retried
            if status not in (429, 503):
                assert outcome.retry_after is None

        try:
            check()
        finally:
            runner.run(provider.close())


# -- whatever an SMTP server answers to a message ----------------------------------------------


def test_every_smtp_reply_to_a_message_is_classified_by_its_code_and_kept_storable(
    runner: asyncio.Runner,
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.RAW)
    with smtp.hostile_smtp(script) as server:
        provider = provider_from_url(server.url("pool_size=1"), timeout=5.0)
        runner.run(provider.start())
        counter = iter(range(10**9))

        @EXAMPLES
        @given(code=st.integers(200, 599), text=st.binary(max_size=400))
        def check(code: int, text: bytes) -> None:
            line = text.replace(b"\r", b"").replace(b"\n", b"")
            script.raw = f"{code} ".encode() + line + b"\r\n"
            n = next(counter)
            outcome = runner.run(send_once(provider, email(n)))
            if code == 250:
                assert isinstance(outcome, Accepted)
                assert outcome.provider_message_id == derived_message_id(f"otp:property-{n}")
                return
            assert isinstance(outcome, Failure)
            check_failure(outcome)
            assert outcome.code == f"smtp_{code}"
            assert outcome.transient is not (500 <= code < 600)

        try:
            check()
        finally:
            runner.run(provider.close())


# -- whatever a producer sends ------------------------------------------------------------------

FIELD_TEXT = st.text(ANY_CHARACTER, max_size=40)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | FIELD_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(FIELD_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    recipient=st.one_of(
        st.emails(), FIELD_TEXT, st.builds(lambda a, b: f"{a}@{b}", FIELD_TEXT, FIELD_TEXT)
    ),
    aggregate_id=st.none() | FIELD_TEXT,
    data=st.dictionaries(FIELD_TEXT, JSON_VALUES, max_size=5),
    secrets=st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), FIELD_TEXT, max_size=3
    ),
)
def test_a_message_that_validates_is_always_written_by_postgresql(
    db_conn: psycopg.Connection[Any],
    recipient: str,
    aggregate_id: str | None,
    data: dict[str, Any],
    secrets: dict[str, str],
) -> None:
    try:
        message = OutboxMessage(
            kind="otp",
            recipient=recipient,
            aggregate_id=aggregate_id,
            data=data,
            secrets={"code": "493817", **secrets},  # the code the otp template needs
        )
    except InvalidMessage:
        return  # refused before any SQL, with the field named: what bad input must get
    try:
        enqueue(db_conn, message, cipher=CIPHER)
        row = db_conn.execute("SELECT recipient, recipient_key FROM leasebox.outbox").fetchone()
    finally:
        db_conn.rollback()
    assert row == (message.recipient, message.recipient_key)


CIPHER = PayloadCipher([generate_key()])
