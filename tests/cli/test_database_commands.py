"""`leasebox migrate`, `enqueue` and `status` from the command line, including bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from leasebox.producer.payload_crypto import KEYS_VARIABLE, generate_key

LEASEBOX = [sys.executable, "-m", "leasebox"]


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LEASEBOX, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
        cwd=Path(__file__).parent,
    )


def test_migrate_reports_what_it_applied_then_that_it_is_up_to_date(empty_db_dsn: str) -> None:
    first = run("migrate", "--dsn", empty_db_dsn)
    second = run("migrate", "--dsn", empty_db_dsn)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_initial" in first.stdout
    assert "up to date" in second.stdout


def test_enqueue_from_flags_prints_the_receipt_and_a_retry_reuses_it(db_dsn: str) -> None:
    args = (
        "enqueue",
        "--dsn",
        db_dsn,
        "--kind",
        "otp",
        "--recipient",
        "ada@example.com",
        "--secret",
        "code=493817",
        "--idempotency-key",
        "k1",
        "--ttl",
        "300",
    )
    env = {**os.environ, KEYS_VARIABLE: generate_key()}
    first = run(*args, env=env)
    second = run(*args, env=env)
    assert first.returncode == 0, first.stderr
    receipt, again = json.loads(first.stdout), json.loads(second.stdout)
    assert receipt["reused"] is False
    assert again == {**receipt, "reused": True}
    assert "493817" not in first.stdout + first.stderr


def test_enqueue_reads_a_json_message_from_stdin(db_dsn: str) -> None:
    message = {
        "kind": "verification",
        "recipient": "ada@example.com",
        "data": {"link": "https://example.com/v/1"},
        "idempotency_key": "abc",
    }
    result = run("enqueue", "--dsn", db_dsn, "--json", stdin=json.dumps(message))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["idempotency_key"] == "abc"


def test_enqueue_with_a_replacement_key_supersedes_the_code_sent_before(db_dsn: str) -> None:
    args = ("enqueue", "--dsn", db_dsn, "--kind", "verification", "--recipient")
    key = ("--replacement-key", "signup-7")
    first = run(*args, "ada@example.com", *key)
    second = run(*args, "ada@example.com", *key)
    assert first.returncode == 0, first.stderr
    old, new = json.loads(first.stdout)["outbox_id"], json.loads(second.stdout)["outbox_id"]
    with psycopg.connect(db_dsn) as conn:
        found = conn.execute(
            "SELECT id, status, superseded_by FROM leasebox.messages ORDER BY id"
        ).fetchall()
    assert found == [(old, "superseded", new), (new, "pending", None)]


def test_an_invalid_message_names_the_field_and_writes_nothing(db_dsn: str) -> None:
    result = run("enqueue", "--dsn", db_dsn, "--kind", "otp", "--recipient", "nobody")
    assert result.returncode == 2
    assert "recipient" in result.stderr
    assert "Traceback" not in result.stderr
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone() == (0,)


def test_a_nul_byte_in_the_data_is_a_one_line_error_before_any_sql(db_dsn: str) -> None:
    message = {"kind": "otp", "recipient": "ada@example.com", "data": {"name": "Ada\u0000"}}
    result = run("enqueue", "--dsn", db_dsn, "--json", stdin=json.dumps(message))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "leasebox enqueue: error: invalid message: data: Value error, must not contain a NUL "
        "byte or a lone surrogate character"
    ]


def test_status_prints_a_table_and_json(db_dsn: str) -> None:
    run("enqueue", "--dsn", db_dsn, "--kind", "otp", "--recipient", "ada@example.com")
    table = run("status", "--dsn", db_dsn)
    as_json = run("status", "--dsn", db_dsn, "--kinds", "otp,invite", "--json")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["KIND", "PENDING", "READY"]
    assert any(line.startswith("otp") for line in table.stdout.splitlines())
    payload = json.loads(as_json.stdout)
    assert payload["total"]["pending"] == 1
    assert set(payload["kinds"]) == {"otp", "invite"}


def test_an_unreachable_database_is_one_line_and_exit_code_1() -> None:
    dsn = "postgresql://app:hunter2-secret@127.0.0.1:1/mail"
    result = run("status", "--dsn", dsn)
    assert result.returncode == 1  # a runtime failure: it may answer on the next try
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot connect to PostgreSQL at 127.0.0.1:1/mail" in result.stderr
    assert "hunter2-secret" not in result.stderr + result.stdout


def test_an_unmigrated_database_says_to_run_migrate(empty_db_dsn: str) -> None:
    result = run("status", "--dsn", empty_db_dsn)
    assert result.returncode == 1
    assert "leasebox migrate" in result.stderr


def test_the_dsn_is_read_from_database_url(db_dsn: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": db_dsn}
    result = run("status", "--kinds", "otp", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["total"]["pending"] == 0


def test_no_dsn_at_all_is_a_clear_error() -> None:
    result = run("status", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "LEASEBOX_DSN" in result.stderr


def test_an_invalid_kind_list_is_rejected_by_the_parser() -> None:
    result = run("status", "--kinds", "OTP;drop")
    assert result.returncode == 2
    assert "invalid kind list" in result.stderr
