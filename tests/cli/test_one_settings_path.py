"""Every command reads the same settings the same way: the DSN and `LEASEBOX_SCHEMA`.

Only `worker` used to read `LEASEBOX_SCHEMA`: `migrate`, `status`, `dead-letters`, `prune` and
`trace` silently acted on the schema `leasebox`, so `dead-letters purge --yes` run with
`LEASEBOX_SCHEMA=tenant_b` purged the wrong tenant. Here two tenants share a database, and
each command, given only the environment, acts on the tenant it names and leaves the other.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from leasebox.cli.main import main
from leasebox.db.partitions import ensure_partitions
from support.outbox_rows import count, insert_message

TENANTS = ("leasebox", "tenant_b")


def dead_letter(conn: psycopg.Connection[Any], schema: str, key: str) -> int:
    outbox_id = insert_message(
        conn,
        schema=schema,
        status="dead",
        dead_reason="rejected",
        kind="otp",
        recipient="ada@example.com",
        template="otp",
        delivery_key=key,
    )
    conn.commit()
    return outbox_id


@pytest.fixture
def tenant_b(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    """The environment of a command run for tenant B: its DSN and its schema, no flags."""
    for name in ("LEASEBOX_DSN", "DATABASE_URL", "LEASEBOX_SCHEMA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", db_dsn)
    monkeypatch.setenv("LEASEBOX_SCHEMA", "tenant_b")
    assert main(["migrate"]) == 0
    assert "tenant_b" in capsys.readouterr().out
    return db_dsn


def test_migrate_creates_the_schema_the_environment_names(
    tenant_b: str, db_conn: psycopg.Connection[Any]
) -> None:
    assert count(db_conn, "outbox", schema="tenant_b") == 0


def test_enqueue_status_and_trace_act_on_the_schema_the_environment_names(
    tenant_b: str, db_conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    link = '{"link": "https://example.com/v/1"}'
    code = main(
        ["enqueue", "--kind", "verification", "--recipient", "ada@example.com", "--data", link]
    )
    receipt = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [count(db_conn, "outbox", schema=s) for s in TENANTS] == [0, 1]
    assert main(["status", "--json"]) == 0
    assert "verification" in json.loads(capsys.readouterr().out)["kinds"]
    assert main(["trace", "--id", str(receipt["outbox_id"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sends"][0]["outbox_id"] == receipt["outbox_id"]


def test_dead_letters_are_listed_and_purged_in_the_schema_the_environment_names(
    tenant_b: str, db_conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ours = dead_letter(db_conn, "tenant_b", "otp:b")
    dead_letter(db_conn, "leasebox", "otp:a")
    assert main(["dead-letters", "list", "--json"]) == 0
    assert [letter["id"] for letter in json.loads(capsys.readouterr().out)] == [ours]
    assert main(["dead-letters", "purge", "--yes"]) == 0
    assert [count(db_conn, "queue", schema=s) for s in TENANTS] == [1, 0]


def test_prune_acts_on_the_schema_the_environment_names(
    tenant_b: str, db_conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=20)
    for schema in TENANTS:
        insert_message(
            db_conn,
            schema=schema,
            status="sent",
            sent_at=long_ago,
            kind="otp",
            recipient="ada@example.com",
            template="otp",
            delivery_key="otp:old",
        )
        db_conn.commit()
        ensure_partitions(db_conn, schema)
    assert main(["prune", "--retention", "7d", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sent"] == 1
    assert [count(db_conn, "outbox", schema=s) for s in TENANTS] == [1, 0]


def test_a_flag_wins_over_the_environment(
    tenant_b: str, db_conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    dead_letter(db_conn, "leasebox", "otp:a")
    assert main(["dead-letters", "list", "--schema", "leasebox", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_a_bad_schema_in_the_environment_is_one_line_naming_the_variable(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LEASEBOX_SCHEMA", "Tenant B")
    assert main(["status", "--dsn", db_dsn]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "LEASEBOX_SCHEMA" in err[0]
