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
        assert {row[0] for row in described["columns"]} == {"outbox", "receipts"}
        assert describe_schema(conn, "leasebox")["columns"] == []


@pytest.mark.parametrize("name", ["Leasebox", "lease box", "x;drop", "pg_catalog", "", "a" * 64])
def test_an_invalid_schema_name_is_rejected_before_touching_the_database(name: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid schema name"):
        migrate("postgresql://nobody@127.0.0.1:1/none", name)
