"""The migrations build the canonical schema, and migrating is safe to repeat and race."""

from __future__ import annotations

import threading

import psycopg
import pytest

from leasebox.db.migrations import (
    applied_versions,
    apply_canonical_schema,
    available_migrations,
    migrate,
)
from leasebox.db.queries import compose
from leasebox.errors import ConfigurationError
from support.schema_catalog import describe_schema


def test_migrations_produce_exactly_the_canonical_schema(empty_db_dsn: str, db_dsn: str) -> None:
    with psycopg.connect(empty_db_dsn) as conn:
        apply_canonical_schema(conn, "leasebox")
        canonical = describe_schema(conn, "leasebox")
    with psycopg.connect(db_dsn) as conn:
        migrated = describe_schema(conn, "leasebox")
    assert canonical["indexes"], "the catalog query found no indexes: the comparison is empty"
    assert migrated == canonical


def test_migrating_twice_applies_nothing_the_second_time(empty_db_dsn: str) -> None:
    first = migrate(empty_db_dsn)
    second = migrate(empty_db_dsn)
    assert [m.version for m in first] == [m.version for m in available_migrations()]
    assert second == []


def test_concurrent_migrations_apply_each_version_once(empty_db_dsn: str) -> None:
    results: list[list[int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def run() -> None:
        try:
            barrier.wait()
            results.append([m.version for m in migrate(empty_db_dsn)])
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    applied = [v for r in results for v in r]
    assert sorted(applied) == [m.version for m in available_migrations()]
    with psycopg.connect(empty_db_dsn) as conn:
        assert applied_versions(conn, "leasebox") == set(applied)


def test_a_custom_schema_name_gets_its_own_tables(empty_db_dsn: str) -> None:
    migrate(empty_db_dsn, "mail_outbox")
    with psycopg.connect(empty_db_dsn) as conn:
        described = describe_schema(conn, "mail_outbox")
        assert {row[0] for row in described["columns"]} == {"outbox", "receipts", "history"}
        assert describe_schema(conn, "leasebox")["columns"] == []


@pytest.mark.parametrize("name", ["Leasebox", "lease box", "x;drop", "pg_catalog", "", "a" * 64])
def test_an_invalid_schema_name_is_rejected_before_touching_the_database(name: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid schema name"):
        migrate("postgresql://nobody@127.0.0.1:1/none", name)


def test_upgrading_a_populated_0001_schema_normalises_recipients_and_drops_orphan_receipts(
    empty_db_dsn: str,
) -> None:
    initial = available_migrations()[0]
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute(compose(initial.text(), "leasebox"))
        conn.execute(
            "CREATE TABLE leasebox.schema_migrations (version integer PRIMARY KEY,"
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("INSERT INTO leasebox.schema_migrations VALUES (1, %s)", (initial.name,))
        ids = [
            row[0]
            for row in conn.execute(
                "INSERT INTO leasebox.outbox (kind, recipient, template, delivery_key)"
                " VALUES ('otp', ' Ada@Example.COM', 'otp', 'k1'), ('otp', 'b@x.org', 'otp', 'k2')"
                " RETURNING id"
            ).fetchall()
        ]
        conn.execute(
            "INSERT INTO leasebox.receipts (scope, idempotency_key, request_hash, outbox_id,"
            " expires_at) VALUES ('login', 'r1', 'h', %s, now() + interval '1 day'),"
            " ('login', 'orphan', 'h', 424242, now() + interval '1 day')",
            (ids[0],),
        )
    assert [m.version for m in migrate(empty_db_dsn)] == [
        m.version for m in available_migrations()[1:]
    ]
    with psycopg.connect(empty_db_dsn) as conn:
        rows = conn.execute(
            "SELECT recipient, recipient_key, scope, message_hash FROM leasebox.outbox ORDER BY id"
        ).fetchall()
        receipts = conn.execute("SELECT idempotency_key FROM leasebox.receipts").fetchall()
    assert rows == [
        (" Ada@Example.COM", "ada@example.com", "login", None),
        ("b@x.org", "b@x.org", None, None),
    ]
    assert receipts == [("r1",)]
