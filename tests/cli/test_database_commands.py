"""`leasebox migrate`, `enqueue` and `status` from the command line, including bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

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
    key = ("--replacement-key", "signup-7", "--data", '{"link": "https://example.com/v/1"}')
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
        "leasebox enqueue: error: invalid message: data: must not contain a NUL "
        "byte or a lone surrogate character"
    ]


def test_status_prints_a_table_and_json(db_dsn: str) -> None:
    env = {**os.environ, KEYS_VARIABLE: generate_key()}
    enqueued = run(
        *("enqueue", "--dsn", db_dsn, "--kind", "otp", "--recipient", "ada@example.com"),
        *("--secret", "code=493817"),
        env=env,
    )
    assert enqueued.returncode == 0, enqueued.stderr
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


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ("--kind", "otp", "--template", "welcome"),
            "leasebox enqueue: error: invalid message: template: 'welcome' is not a registered "
            "template",
        ),
        (
            ("--kind", "newsletter", "--template", "otp", "--secret", "code=1"),
            "leasebox enqueue: error: invalid message: kind: 'newsletter' is not a registered kind",
        ),
        (
            ("--kind", "otp"),
            "leasebox enqueue: error: invalid message: code: the 'otp' template needs this "
            "variable; give it in data or secrets",
        ),
    ],
)
def test_enqueue_refuses_what_no_worker_could_send_in_one_line_and_writes_nothing(
    db_dsn: str, flags: tuple[str, ...], line: str
) -> None:
    result = run("enqueue", "--dsn", db_dsn, "--recipient", "ada@example.com", *flags)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(line)
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone() == (0,)


def test_enqueue_accepts_the_kinds_and_templates_the_workers_are_given(
    db_dsn: str, tmp_path: Path
) -> None:
    (tmp_path / "welcome").mkdir()
    (tmp_path / "welcome" / "subject.txt.j2").write_text("Welcome")
    (tmp_path / "welcome" / "body.txt.j2").write_text("Hello {{ name }}")
    flags = ("--kind", "newsletter", "--template", "welcome", "--recipient", "ada@example.com")
    refused = run("enqueue", "--dsn", db_dsn, *flags)
    by_flags = run(
        "enqueue", "--dsn", db_dsn, *flags, "--kinds", "newsletter", "--templates", str(tmp_path)
    )
    environment = {
        **os.environ,
        "LEASEBOX_KINDS": "newsletter",
        "LEASEBOX_TEMPLATES": str(tmp_path),
    }
    by_variables = run("enqueue", "--dsn", db_dsn, *flags, env=environment)
    assert refused.returncode == 2
    assert (by_flags.returncode, by_variables.returncode) == (0, 0), by_flags.stderr
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone() == (2,)


def schema_exists(dsn: str, schema: str = "leasebox") -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (schema,)).fetchone()
    return bool(row and row[0])


def test_migrate_check_exits_1_naming_what_is_pending_and_applies_nothing(
    empty_db_dsn: str,
) -> None:
    pending = run("migrate", "--dsn", empty_db_dsn, "--check")
    assert pending.returncode == 1
    [line] = pending.stderr.splitlines()
    assert line.startswith(
        "leasebox migrate: error: the leasebox schema 'leasebox' is not migrated"
    )
    assert "0001_initial" in line
    assert line.endswith("run `leasebox migrate --schema leasebox`")
    assert not schema_exists(empty_db_dsn)

    assert run("migrate", "--dsn", empty_db_dsn).returncode == 0
    current = run("migrate", "--dsn", empty_db_dsn, "--check")
    assert current.returncode == 0, current.stderr
    assert current.stdout.startswith("schema leasebox is up to date")


def test_migrate_check_names_the_one_migration_a_schema_lacks(empty_db_dsn: str) -> None:
    run("migrate", "--dsn", empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as conn:
        row = conn.execute(
            "DELETE FROM leasebox.schema_migrations WHERE version ="
            " (SELECT max(version) FROM leasebox.schema_migrations) RETURNING version, name"
        ).fetchone()
    assert row is not None
    result = run("migrate", "--dsn", empty_db_dsn, "--check")
    assert result.returncode == 1
    assert f"1 migration(s) pending: {row[0]:04d}_{row[1]};" in result.stderr


def test_migrate_plan_prints_the_sql_it_would_run_and_applies_nothing(empty_db_dsn: str) -> None:
    plan = run("migrate", "--dsn", empty_db_dsn, "--plan", "--schema", "mail")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("-- 0001_initial\n")
    assert 'CREATE TABLE "mail".outbox (' in plan.stdout
    assert not schema_exists(empty_db_dsn, "mail")
    run("migrate", "--dsn", empty_db_dsn, "--schema", "mail")
    after = run("migrate", "--dsn", empty_db_dsn, "--plan", "--schema", "mail")
    assert after.stdout == "-- schema mail is up to date: nothing to apply\n"
