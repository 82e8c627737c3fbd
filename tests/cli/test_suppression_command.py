"""`leasebox suppression list|add|remove|import` against a real database, as a person runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

LEASEBOX = [sys.executable, "-m", "leasebox"]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LEASEBOX, "suppression", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).parent,
    )


def test_add_list_and_remove_an_address_by_any_spelling_of_its_mailbox(db_dsn: str) -> None:
    added = run("add", "--dsn", db_dsn, "--scope", "login", "--expires-in", "30d",
                "--detail", "asked by support", "A.Da+x@Gmail.com")  # fmt: skip
    listed = run("list", "--dsn", db_dsn, "--json")
    shown = run("list", "--dsn", db_dsn, "--show-recipients", "--address", "ada@gmail.com")
    removed = run("remove", "--dsn", db_dsn, "--scope", "login", "ada@googlemail.com")
    again = run("remove", "--dsn", db_dsn, "--scope", "login", "ada@gmail.com")

    assert added.returncode == 0, added.stderr
    [entry] = json.loads(listed.stdout)
    assert entry["recipient_key"] == "a***@gmail.com"  # masked unless asked
    assert (entry["scope"], entry["reason"], entry["detail"]) == (
        "login",
        "manual",
        "asked by support",
    )
    assert entry["expires_at"] is not None
    assert "ada@gmail.com" in shown.stdout
    assert "removed from scope 'login' (it was manual)" in removed.stdout
    assert "not on the list" in again.stdout


def test_import_reads_addresses_and_csv_rows_and_refuses_a_bad_file_whole(
    db_dsn: str, db_conn: psycopg.Connection
) -> None:
    good = "# exported from the provider\nada@example.org\nbob@example.org,complaint,,spam\n"
    bad = "carol@example.org\nnot-an-address\n"

    imported = run("import", "--dsn", db_dsn, "--reason", "hard_bounce", "-", stdin=good)
    refused = run("import", "--dsn", db_dsn, "-", stdin=bad)

    assert imported.returncode == 0, imported.stderr
    assert "imported 2 entries" in imported.stdout
    assert refused.returncode == 2
    assert "line 2" in refused.stderr
    rows = db_conn.execute(
        "SELECT recipient_key, reason, detail FROM leasebox.suppressions ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("ada@example.org", "hard_bounce", None),
        ("bob@example.org", "complaint", "spam"),
    ]


def test_an_unknown_reason_is_a_usage_error(db_dsn: str) -> None:
    result = run("add", "--dsn", db_dsn, "--reason", "grumpy", "ada@example.org")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_feedback_serve_without_any_service_secret_is_a_usage_error(db_dsn: str) -> None:
    result = subprocess.run(
        [*LEASEBOX, "feedback", "serve", "--dsn", db_dsn],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("LEASEBOX_FEEDBACK_")},
    )
    assert result.returncode == 2
    assert "no service to receive" in result.stderr


def test_a_malformed_service_secret_names_its_variable(db_dsn: str) -> None:
    env = {**os.environ, "LEASEBOX_FEEDBACK_RESEND_SECRETS": "whsec_%%%"}
    result = subprocess.run(
        [*LEASEBOX, "feedback", "serve", "--dsn", db_dsn],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert result.returncode == 2
    assert "LEASEBOX_FEEDBACK_RESEND_SECRETS" in result.stderr
    assert "%%%" not in result.stderr
