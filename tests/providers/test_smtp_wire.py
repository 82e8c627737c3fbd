"""What the SMTP wire reads as a reply (RFC 5321, 4.2) and how it writes a message after DATA
(RFC 5321, 4.5.2): the pure parts of `leasebox.delivery.providers.smtp_wire`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasebox.delivery.providers.smtp_wire import (
    MAX_REPLY,
    MAX_REPLY_LINE,
    Reply,
    data_lines,
    parse_replies,
)


def test_a_one_line_reply_is_its_code_and_text() -> None:
    assert parse_replies(b"250 2.0.0 Ok: queued as 4F2\r\n") == (
        [Reply(250, "2.0.0 Ok: queued as 4F2")],
        b"",
    )


def test_a_multiline_reply_is_one_reply_with_a_line_per_line() -> None:
    replies, rest = parse_replies(b"250-mail.example\r\n250-PIPELINING\r\n250 SIZE 1000\r\n")

    assert replies == [Reply(250, "mail.example\nPIPELINING\nSIZE 1000")]
    assert rest == b""


def test_replies_of_a_pipelined_group_arrive_together_and_are_read_in_order() -> None:
    replies, rest = parse_replies(b"250 ok\r\n550 5.1.1 unknown\r\n554 no valid recipients\r\n")

    assert [r.code for r in replies] == [250, 550, 554]
    assert rest == b""


@pytest.mark.parametrize(
    "partial", [b"25", b"250 queued", b"250-first line\r\n", b"250-first\r\n250 la"]
)
def test_the_start_of_a_reply_waits_for_the_rest(partial: bytes) -> None:
    assert parse_replies(b"250 ok\r\n" + partial) == ([Reply(250, "ok")], partial)


@given(
    code=st.integers(100, 999),
    text=st.binary(max_size=200).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
)
def test_a_reply_reads_the_same_alone_as_among_others(code: int, text: bytes) -> None:
    line = b"%d %s\r\n" % (code, text)
    try:
        alone = parse_replies(line)
    except ValueError:
        with pytest.raises(ValueError, match="not a reply line"):
            parse_replies(line + b"250 next\r\n")
        return

    among, rest = parse_replies(line + b"250 next\r\n")
    assert (among[:1], rest) == alone
    assert 200 <= alone[0][0].code < 600


def test_a_bare_line_feed_ends_a_line_too_and_a_code_may_stand_alone() -> None:
    assert parse_replies(b"354\n221 bye\n") == ([Reply(354, ""), Reply(221, "bye")], b"")


def test_text_that_is_not_utf8_is_replaced_not_fatal() -> None:
    [reply], _ = parse_replies(b"451 \xff\xfe\x00 busy\r\n")

    assert reply.code == 451
    assert reply.text == "\ufffd\ufffd\x00 busy"


@pytest.mark.parametrize(
    "garbage",
    [
        b"hello\r\n",
        b"25x ok\r\n",
        b"2500 ok\r\n",
        b"250_ok\r\n",
        b"199 not an SMTP reply\r\n",
        b"600 no such class\r\n",
        b" 250 ok\r\n",
        b"\r\n",
        b"250-first\r\n251 second\r\n",  # a multiline reply keeps its code
    ],
)
def test_anything_but_a_reply_line_is_unreadable(garbage: bytes) -> None:
    with pytest.raises(ValueError, match="not a reply line"):
        parse_replies(garbage)


def test_a_line_too_long_is_unreadable_before_it_ends() -> None:
    with pytest.raises(ValueError, match="too long"):
        parse_replies(b"250 " + b"Z" * MAX_REPLY_LINE)
    with pytest.raises(ValueError, match="too long"):
        parse_replies(b"250 " + b"Z" * MAX_REPLY_LINE + b"\r\n")


def test_a_reply_too_long_is_unreadable_before_it_ends() -> None:
    line = b"250-" + b"x" * 1000 + b"\r\n"
    parse_replies(line * (MAX_REPLY // len(line)))
    with pytest.raises(ValueError, match="too long"):
        parse_replies(line * (MAX_REPLY // len(line) + 1))


def test_a_message_goes_out_dot_stuffed_and_ends_with_the_end_of_data_line() -> None:
    message = b".starts\r\nplain\r\n.\r\n..two\r\nend.\r\n"

    assert data_lines(message) == b"..starts\r\nplain\r\n..\r\n...two\r\nend.\r\n.\r\n"


def test_a_message_without_its_final_line_end_is_refused() -> None:
    with pytest.raises(ValueError, match="line end"):
        data_lines(b"no line end")
