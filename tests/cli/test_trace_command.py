"""`leasebox trace` against a real PostgreSQL, on rows written with plain SQL.

The rows are what the worker writes for a stalled worker that lost its lease after its send
was accepted, a send made by three requests, and an aggregate with two sends; the command
must tell each story in words and JSON, by every selector, without a secret, a code, the
data or the full recipient, and refuse bad selectors with one clear line.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg
import pytest

from leasebox.cli.main import main
from leasebox.delivery.providers.base import derived_message_id

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
TOKEN_A, TOKEN_B = UUID(int=0xA), UUID(int=0xB)
CODE = "493817"
DATA_MARKER = "data-never-shown"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def insert_row(
    conn: psycopg.Connection, key: str, *, aggregate: str = "user-1", kind: str = "otp"
) -> int:
    # A message gone from the queue: sent, as its history (written by each test) tells.
    row = conn.execute(
        "INSERT INTO leasebox.outbox (bucket, kind, aggregate_id, recipient, template, data,"
        " secrets, delivery_key, created_at) VALUES ((%s::timestamptz AT TIME ZONE 'UTC')::date,"
        " %s, %s, 'jane.doe@example.com', 'otp', %s, %s, %s, %s) RETURNING id",
        (
            T0,
            kind,
            aggregate,
            json.dumps({"name": DATA_MARKER}),
            f"code={CODE}".encode(),
            key,
            T0,
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def insert_receipt(conn: psycopg.Connection, outbox_id: int, key: str, reuses: int) -> None:
    conn.execute(
        "INSERT INTO leasebox.receipts (scope, idempotency_key, bucket, request_hash, outbox_id,"
        " outbox_bucket, created_at, expires_at, last_seen_at, reuse_count)"
        " SELECT 'default', %(key)s, (%(expires)s::timestamptz AT TIME ZONE 'UTC')::date, 'h', id,"
        " bucket, %(created)s, %(expires)s, %(seen)s, %(reuses)s FROM leasebox.outbox"
        " WHERE id = %(id)s",
        {
            "key": key,
            "id": outbox_id,
            "created": T0,
            "expires": at(86400),
            "seen": at(30),
            "reuses": reuses,
        },
    )


def insert_event(
    conn: psycopg.Connection, outbox_id: int, event: str, seconds: float, **f: object
) -> None:
    conn.execute(
        "INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at, attempt, lease_token,"
        " worker_id, lease_expires_at, error_class, error, provider_message_id)"
        " SELECT id, bucket, kind, %s, %s, %s, %s, %s, %s, %s, %s, %s FROM leasebox.outbox"
        " WHERE id = %s",
        (
            event,
            at(seconds),
            f.get("attempt"),
            f.get("token"),
            f.get("worker"),
            f.get("expires"),
            f.get("error_class"),
            f.get("error"),
            f.get("provider_message_id"),
            outbox_id,
        ),
    )


def stalled_worker(conn: psycopg.Connection, key: str = "otp:user-1:ch-1") -> int:
    """A: claimed, lease ran out, reclaimed by B, sent by B, A's late send accepted too."""
    outbox_id = insert_row(conn, key)
    accepted = derived_message_id(key)
    events: list[tuple[str, float, dict[str, object]]] = [
        ("claimed", 0, {"attempt": 1, "token": TOKEN_A, "worker": "worker-a", "expires": at(45)}),
        (
            "lease_expired",
            47,
            {"attempt": 1, "token": TOKEN_A, "worker": "worker-a", "expires": at(45)},
        ),
        ("claimed", 48, {"attempt": 2, "token": TOKEN_B, "worker": "worker-b", "expires": at(93)}),
        (
            "sent",
            48.5,
            {"attempt": 2, "token": TOKEN_B, "worker": "worker-b", "provider_message_id": accepted},
        ),
        (
            "lease_lost",
            52,
            {"attempt": 1, "token": TOKEN_A, "worker": "worker-a", "provider_message_id": accepted},
        ),
    ]
    for event, seconds, fields in events:
        insert_event(conn, outbox_id, event, seconds, **fields)
    return outbox_id


def trace(capsys: pytest.CaptureFixture[str], dsn: str, *args: str) -> tuple[int, str, str]:
    code = main(["trace", "--dsn", dsn, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_stalled_workers_lost_lease_is_told_as_a_race_with_two_accepted_copies(
    db_conn: psycopg.Connection, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outbox_id = stalled_worker(db_conn)
    insert_receipt(db_conn, outbox_id, "login-42", 2)
    db_conn.commit()
    code, out, err = trace(capsys, db_dsn, "--id", str(outbox_id))
    assert (code, err) == (0, "")
    assert out.startswith(f"trace of outbox id {outbox_id}: 1 logical send from 3 requests\n")
    assert "to j***@example.com, sent" in out
    assert (
        "what happened: claimed by worker-a, worker-a's lease ran out at 2026-12-01T12:00:45Z "
        "after 45 s, reclaimed by worker-b, sent by worker-b at 2026-12-01T12:00:48Z, lease lost "
        "by worker-a at 2026-12-01T12:00:52Z (worker stalled 52 s): its send was accepted too"
    ) in out
    assert "ownership: 2 workers raced it (worker-a, worker-b)" in out
    assert "copies: the provider accepted 2 copies, all under the same delivery key" in out
    assert "3 requests with idempotency key 'login-42' in scope 'default'" in out
    for secret in (CODE, DATA_MARKER, "jane.doe"):
        assert secret not in out


def test_the_json_carries_the_answers_and_the_timeline(
    db_conn: psycopg.Connection, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outbox_id = stalled_worker(db_conn)
    db_conn.commit()
    code, out, _ = trace(capsys, db_dsn, "--delivery-key", "otp:user-1:ch-1", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["selector"] == {"delivery_key": "otp:user-1:ch-1"}
    assert (data["logical_sends"], data["requests"]) == (1, 1)
    (send,) = data["sends"]
    assert send["outbox_id"] == outbox_id
    assert send["requests"]["without_idempotency_key"] is True
    assert send["ownership"]["verdict"] == "raced"
    assert (send["copies"]["accepted"], send["copies"]["possible"]) == (2, 0)
    assert [e["event"] for e in send["timeline"]] == [
        "claimed",
        "lease_expired",
        "claimed",
        "sent",
        "lease_lost",
    ]
    assert send["recipient"] == "j***@example.com"
    assert CODE not in out
    assert DATA_MARKER not in out


def test_an_idempotency_key_finds_its_send_in_its_scope_only(
    db_conn: psycopg.Connection, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outbox_id = stalled_worker(db_conn)
    insert_receipt(db_conn, outbox_id, "login-42", 2)
    db_conn.commit()
    code, out, _ = trace(capsys, db_dsn, "--idempotency-key", "login-42", "--json")
    assert code == 0
    assert json.loads(out)["sends"][0]["outbox_id"] == outbox_id
    assert json.loads(out)["requests"] == 3
    code, out, err = trace(capsys, db_dsn, "--idempotency-key", "login-42", "--scope", "other")
    assert (code, out) == (1, "")
    assert err == (
        "leasebox trace: error: nothing to trace: no send has idempotency key 'login-42' in "
        "scope 'other'\n"
    )


def test_an_aggregate_lists_its_sends_newest_first_within_kind_and_limit(
    db_conn: psycopg.Connection, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = insert_row(db_conn, "otp:user-1:a")
    second = insert_row(db_conn, "otp:user-1:b")
    insert_row(db_conn, "verify:user-1", kind="verification")
    insert_row(db_conn, "otp:user-2:c", aggregate="user-2")
    db_conn.commit()
    code, out, _ = trace(capsys, db_dsn, "--aggregate-id", "user-1", "--kind", "otp", "--json")
    assert code == 0
    data = json.loads(out)
    assert [s["outbox_id"] for s in data["sends"]] == [second, first]
    assert data["logical_sends"] == 2
    code, out, _ = trace(capsys, db_dsn, "--aggregate-id", "user-1", "--limit", "1")
    assert out.startswith("trace of aggregate id 'user-1': 1 logical send from 1 request")
    assert "verification" in out
    code, out, _ = trace(capsys, db_dsn, "--aggregate-id", "user-1")
    assert out.startswith("trace of aggregate id 'user-1': 3 logical sends from 3 requests")


def test_recipients_are_shown_only_when_asked_for(
    db_conn: psycopg.Connection, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outbox_id = insert_row(db_conn, "otp:user-1:a")
    db_conn.commit()
    _, out, _ = trace(capsys, db_dsn, "--id", str(outbox_id), "--show-recipients")
    assert "to jane.doe@example.com, sent" in out
    assert "attempts: none recorded" in out


def test_nothing_found_is_one_line_naming_the_selector(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = trace(capsys, db_dsn, "--id", "999")
    assert (code, out) == (1, "")
    assert err == "leasebox trace: error: nothing to trace: no send has outbox id 999\n"
    code, _, err = trace(capsys, db_dsn, "--aggregate-id", "nobody", "--kind", "otp")
    assert code == 1
    assert "no send has aggregate id 'nobody' of kind 'otp'" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "1", "--delivery-key", "k"], "not allowed with argument"),
        ([], "one of the arguments --id --delivery-key --idempotency-key --aggregate-id"),
        (["--id", "0"], "expected a positive whole number, got '0'"),
        (["--delivery-key", " "], "the delivery key must not be empty"),
        (["--aggregate-id", "u", "--kind", "Not A Kind"], "invalid kind list"),
    ],
)
def test_a_bad_selector_is_a_usage_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["trace", "--dsn", "postgresql://nobody@127.0.0.1:1/none", *args])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "1", "--scope", "s"], "--scope goes with --idempotency-key"),
        (["--id", "1", "--kind", "otp"], "--kind and --limit go with --aggregate-id"),
    ],
)
def test_a_flag_that_does_not_fit_the_selector_is_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["trace", "--dsn", "postgresql://nobody@127.0.0.1:1/none", *args])
    assert code == 2
    assert capsys.readouterr().err == f"leasebox trace: error: {message}\n"


def test_an_unreachable_database_is_one_line_and_exit_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["trace", "--dsn", "postgresql://nobody:pw-x@127.0.0.1:1/none", "--id", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("leasebox trace: error: cannot connect to PostgreSQL at 127.0.0.1:1/none")
    assert "pw-x" not in err
    assert "Traceback" not in err


def test_a_schema_without_the_history_table_asks_for_the_migration(
    db_conn: psycopg.Connection, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db_conn.execute("DROP TABLE leasebox.history CASCADE")
    db_conn.commit()
    code = main(["trace", "--dsn", db_dsn, "--id", "1"])
    assert code == 1
    assert "is not migrated: it has no attempt history table; run `leasebox migrate" in (
        capsys.readouterr().err
    )
