"""The states Python names are the states the schema allows and the queries write; every
named query says what it does; shared SQL is written once."""

from __future__ import annotations

import re

import pytest

from leasebox.db import queries
from leasebox.db.queries import CORE, NOTIFY_CHANNEL, SqlFile, named_queries, query, read_sql_file
from leasebox.states import DeadReason, Event, Status

QUERIES_TEXT = read_sql_file("queries.sql")


def test_the_status_enum_is_the_queues_states_and_the_ways_a_message_leaves_it() -> None:
    schema = read_sql_file("schema.sql")
    allowed = re.search(r"CHECK \(status IN \(([^)]*)\)\)", schema)
    assert allowed is not None
    queued = set(re.findall(r"'([a-z_]+)'", allowed.group(1)))
    gone = {Status.SENT.value, Status.SUPERSEDED.value, Status.SUPPRESSED.value}
    assert queued == {s.value for s in Status} - gone
    view = re.findall(r"coalesce\(q\.status, s\.event, '([a-z_]+)'\) AS status", schema)
    assert view == [Status.SENT.value]
    final_events = re.search(r"h\.event IN \(([^)]*)\)", schema)
    assert final_events is not None
    assert set(re.findall(r"'([a-z_]+)'", final_events.group(1))) == gone


def test_every_status_the_queries_name_is_a_status() -> None:
    named = set(re.findall(r"status\s*(?:=|IN \()\s*'([a-z_]+)'", QUERIES_TEXT))
    cases = re.findall(
        r"status = CASE WHEN [^\n]*\s+THEN '([a-z_]+)' ELSE '([a-z_]+)'", QUERIES_TEXT
    )
    assert cases
    named |= {value for case in cases for value in case}
    assert named
    assert named <= {s.value for s in Status}


def _history_events_allowed() -> set[str]:
    schema = read_sql_file("schema.sql")
    allowed = re.search(r"CHECK \(event IN \(([^)]*)\)\)", schema)
    assert allowed is not None
    return set(re.findall(r"'([a-z_]+)'", allowed.group(1)))


def test_every_history_event_the_schema_allows_is_written_and_nothing_else() -> None:
    inserts = re.findall(
        r"INSERT INTO \{schema\}\.history.*?\n\s*SELECT (.*?)\n\s*(?:FROM|-- include)",
        QUERIES_TEXT,
        re.S,
    )
    written: set[str] = set()
    for select in inserts:
        written |= set(re.findall(r"'([a-z_]+)'", select))
    assert written == _history_events_allowed()


def test_the_event_enum_is_the_history_tables_check_constraint() -> None:
    assert _history_events_allowed() == {e.value for e in Event}


def test_every_statement_that_changes_a_row_writes_its_history() -> None:
    changes = {
        named.name
        for named in named_queries(CORE).values()
        if re.search(r"UPDATE \{schema\}\.queue|DELETE FROM \{schema\}\.queue", named.text)
    }
    assert {"claim", "mark_sent", "purge_dead_letters"} <= changes
    untold = {"extend_leases"}  # an extension is not an event: the lease goes on
    for name in changes - untold:
        assert "{schema}.history" in named_queries(CORE)[name].text, name


def test_every_dead_reason_the_queries_write_is_a_dead_reason() -> None:
    written = set(re.findall(r"dead_reason = '([a-z_]+)'", QUERIES_TEXT))
    written |= set(re.findall(r"THEN '([a-z_]+)' END", QUERIES_TEXT))
    assert written == {DeadReason.EXPIRED.value, DeadReason.ATTEMPTS_EXHAUSTED.value}
    assert written <= {r.value for r in DeadReason}


def test_every_named_query_has_a_one_line_description() -> None:
    for named in named_queries(CORE).values():
        assert named.description, named.name
        assert not named.description.startswith("--"), named.name
        assert named.text, named.name
        assert "-- include:" not in named.text, named.name


def test_the_dead_letter_selection_is_written_once() -> None:
    assert QUERIES_TEXT.count("dead_reason = %(reason)s::text") == 1
    for name in ("list_dead_letters", "count_dead_letters", "requeue_dead_letters"):
        assert "dead_reason = %(reason)s::text" in query(name).as_string()


def test_a_receipts_message_is_looked_up_by_one_fragment_included_twice() -> None:
    lookup = "WHERE m.id = rr.outbox_id AND m.bucket = rr.outbox_bucket"
    assert QUERIES_TEXT.count(lookup) == 1
    for name in ("find_receipt", "enqueue_many"):
        assert lookup in query(name).as_string(), name


def test_the_notify_channel_is_the_one_in_the_trigger_and_the_listen() -> None:
    assert NOTIFY_CHANNEL in query("listen").as_string()
    assert NOTIFY_CHANNEL not in QUERIES_TEXT
    schema = queries.compose(read_sql_file("schema.sql"), "leasebox").as_string()
    assert f"pg_notify('{NOTIFY_CHANNEL}'" in schema


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: a\nSELECT 1;\n", "lacks its one-line description"),
        ("-- name: a\n-- A.\nSELECT 1;\n-- name: a\n-- B.\nSELECT 2;\n", "twice"),
        ("-- name: a\n-- A.\nSELECT\n-- include: nowhere\n", "unknown fragment"),
        ("-- name: a\n-- A.\nSELECT 'two\n  lines';\n", "query 'a': a string spans lines"),
        ("-- name: a\n-- A.\nDO $$ BEGIN\nEND $$;\n", "query 'a': a string spans lines"),
    ],
)
def test_a_malformed_query_file_is_refused_by_name(
    text: str, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = SqlFile("leasebox.db", "broken.sql")
    monkeypatch.setattr(SqlFile, "read", lambda self: text)
    with pytest.raises(ValueError, match=error):
        named_queries(broken)
