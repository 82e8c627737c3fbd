"""The Django app: migrations that create leasebox's tables, settings, and misuse refused."""

from __future__ import annotations

import io
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path

import psycopg
import pytest
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.transaction import TransactionManagementError

import leasebox.django
import leasebox.django.migrations
from leasebox import OutboxMessage
from leasebox.db.migrations import available_migrations
from leasebox.django.apps import check_settings
from support.orm_producers import add_django_database, remove_django_database

CODE = {"code": "493817"}  # what the otp template needs


@pytest.fixture
def django_alias(db_dsn: str) -> Iterator[str]:
    alias = add_django_database(db_dsn)
    yield alias
    remove_django_database(alias)


@pytest.fixture
def django_empty_alias(empty_db_dsn: str) -> Iterator[str]:
    alias = add_django_database(empty_db_dsn)
    yield alias
    remove_django_database(alias)


def tables(dsn: str, schema: str = "leasebox") -> set[str]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    return {str(row[0]) for row in found}


def test_installed_as_leasebox_django_the_app_has_the_label_leasebox() -> None:
    config = apps.get_app_config("leasebox")
    assert config.name == "leasebox.django"


def test_manage_py_migrate_creates_the_outbox_tables(
    django_empty_alias: str, empty_db_dsn: str
) -> None:
    call_command("migrate", "leasebox", database=django_empty_alias, verbosity=0)

    assert {"outbox", "receipts", "schema_migrations"} <= tables(empty_db_dsn)


def test_the_migrations_are_recorded_under_the_label_so_where_the_app_lives_is_no_matter(
    django_empty_alias: str, empty_db_dsn: str
) -> None:
    call_command("migrate", "leasebox", database=django_empty_alias, verbosity=0)
    with psycopg.connect(empty_db_dsn) as conn:
        recorded = conn.execute("SELECT DISTINCT app FROM django_migrations").fetchall()
    executor = MigrationExecutor(connections[django_empty_alias])
    left = executor.migration_plan(executor.loader.graph.leaf_nodes("leasebox"))

    assert recorded == [("leasebox",)]
    assert left == []


def test_leasebox_migrate_applies_what_is_missing_and_then_nothing(
    django_empty_alias: str, empty_db_dsn: str
) -> None:
    first, second = io.StringIO(), io.StringIO()
    call_command("leasebox_migrate", database=django_empty_alias, stdout=first)
    call_command("leasebox_migrate", database=django_empty_alias, stdout=second)

    assert "applied leasebox migration 0001 initial" in first.getvalue()
    assert second.getvalue().strip() == "leasebox schema is up to date"
    assert {"outbox", "receipts"} <= tables(empty_db_dsn)


def test_leasebox_migrate_takes_another_schema(django_empty_alias: str, empty_db_dsn: str) -> None:
    call_command(
        "leasebox_migrate", database=django_empty_alias, schema="mail", stdout=io.StringIO()
    )

    assert {"outbox", "receipts"} <= tables(empty_db_dsn, "mail")
    assert tables(empty_db_dsn) == set()


def test_the_django_migrations_reach_the_latest_leasebox_migration() -> None:
    folder = Path(leasebox.django.migrations.__file__).parent
    names = sorted(p.stem for p in folder.glob("0*.py"))
    versions = [
        import_module(f"leasebox.django.migrations.{name}").LEASEBOX_VERSION for name in names
    ]
    assert versions == [m.version for m in available_migrations()], "one per SQL migration"
    assert [int(name[:4]) for name in names] == versions


def test_enqueue_outside_an_atomic_block_is_refused_and_writes_nothing(
    django_alias: str, db_dsn: str
) -> None:
    with pytest.raises(TransactionManagementError, match=r"transaction\.atomic\(\)"):
        leasebox.django.enqueue(
            OutboxMessage(kind="otp", recipient="ada@example.com", secrets=CODE), using=django_alias
        )

    with psycopg.connect(db_dsn) as observer:
        row = observer.execute("SELECT count(*) FROM leasebox.outbox").fetchone()
    assert row == (0,)


def test_the_schema_and_database_come_from_settings_leasebox(
    django_empty_alias: str, empty_db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        settings, "LEASEBOX", {"SCHEMA": "mail", "DATABASE": django_empty_alias}, raising=False
    )
    call_command("leasebox_migrate", stdout=io.StringIO())

    with transaction.atomic(using=django_empty_alias):
        receipt = leasebox.django.enqueue(
            OutboxMessage(kind="otp", recipient="ada@example.com", secrets=CODE)
        )

    with psycopg.connect(empty_db_dsn) as observer:
        row = observer.execute("SELECT id FROM mail.outbox").fetchone()
    assert row == (receipt.outbox_id,)


def test_the_guard_configured_in_settings_applies(
    django_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        settings, "LEASEBOX", {"GUARD": {"per_recipient": 1, "window_seconds": 60}}, raising=False
    )
    message = OutboxMessage(kind="otp", recipient="ada@example.com", secrets=CODE)
    with transaction.atomic(using=django_alias):
        leasebox.django.enqueue(message, using=django_alias)
    with pytest.raises(leasebox.RateLimited), transaction.atomic(using=django_alias):
        leasebox.django.enqueue(message, using=django_alias)


def test_settings_fall_back_to_leasebox_environment_variables() -> None:
    configured = leasebox.django.read_settings({}, {"LEASEBOX_SCHEMA": "mail"})
    assert configured.schema == "mail"
    assert configured.database == "default"
    assert configured.guard is None


@pytest.mark.parametrize(
    ("configured", "named"),
    [
        ({"SCHEMAS": "x"}, "unknown key 'SCHEMAS'"),
        ({"SCHEMA": "Bad-Name"}, "LEASEBOX['SCHEMA'] invalid schema name"),
        ({"GUARD": {"per_recipent": 3}}, "unknown key 'per_recipent'"),
        ({"GUARD": {"per_recipient": 0}}, "LEASEBOX['GUARD'] is invalid"),
        ({"PAYLOAD_KEYS": ["not-a-key"]}, "LEASEBOX['PAYLOAD_KEYS']"),
        ({"RECEIPT_TTL_SECONDS": "1 day"}, "LEASEBOX['RECEIPT_TTL_SECONDS']"),
    ],
)
def test_malformed_settings_name_the_setting(configured: dict[str, object], named: str) -> None:
    with pytest.raises(ImproperlyConfigured) as caught:
        leasebox.django.read_settings(configured, {})
    assert named in str(caught.value)


def test_manage_py_check_reports_malformed_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "LEASEBOX", {"SCHEMA": "pg_catalog"}, raising=False)
    [error] = check_settings()
    assert error.id == "leasebox.E001"
    monkeypatch.setattr(settings, "LEASEBOX", {}, raising=False)
    assert check_settings() == []


def test_a_connection_that_is_not_postgresql_is_refused() -> None:
    assert connections["default"].vendor != "postgresql"
    with pytest.raises(leasebox.ConfigurationError, match="needs PostgreSQL"):
        leasebox.django.enqueue(
            OutboxMessage(kind="otp", recipient="ada@example.com", secrets=CODE), using="default"
        )
