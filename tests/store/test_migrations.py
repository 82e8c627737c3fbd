"""The migrations build the canonical schema, and migrating is safe to repeat and race."""

from __future__ import annotations

import re
import threading
from datetime import date, datetime
from typing import Any

import psycopg
import pytest

from leasebox import enqueue
from leasebox.db.migrations import (
    applied_versions,
    apply_canonical_schema,
    available_migrations,
    migrate,
)
from leasebox.db.queries import compose
from leasebox.errors import ConfigurationError
from support.outbox_rows import SEALING, otp
from support.schema_catalog import describe_schema


def test_migrations_produce_exactly_the_canonical_schema(
    empty_db_dsn: str, other_empty_db_dsn: str
) -> None:
    # Both built now: the session's migrated database may be from the day before, and its
    # partition maintenance since then would give it a day the canonical schema lacks.
    with psycopg.connect(empty_db_dsn) as conn:
        apply_canonical_schema(conn, "leasebox")
        canonical = _days_from_first(describe_schema(conn, "leasebox"))
    migrate(other_empty_db_dsn)
    with psycopg.connect(other_empty_db_dsn) as conn:
        migrated = _days_from_first(describe_schema(conn, "leasebox"))
    assert canonical["indexes"], "the catalog query found no indexes: the comparison is empty"
    assert migrated == canonical


DAY = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})")


def _days_from_first(schema: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """The schema with its day partitions named by their day's distance from the first day:
    the two schemas may be built on either side of midnight."""
    days = [date(*map(int, m)) for row in schema["partitions"] for m in DAY.findall(str(row))]
    if not days:
        return schema
    first = min(days)

    def relative(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        return DAY.sub(lambda m: f"day+{(date(*map(int, m.groups())) - first).days}", text)

    partitions = [tuple(relative(v) for v in row) for row in schema["partitions"]]
    return schema | {"partitions": partitions}


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
        tables = {row[0] for row in described["columns"]}
        assert {"outbox", "queue", "receipts", "history", "messages", "audit"} <= tables
        assert {t.split("_")[0] for t in tables} == {
            "guard",
            "outbox",
            "queue",
            "receipts",
            "history",
            "messages",
            "quotas",
            "audit",
            "events",
            "suppressions",
            "feedback",
        }
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


UPGRADE_0003 = """
INSERT INTO leasebox.outbox
    (kind, aggregate_id, recipient, recipient_key, scope, template, delivery_key, status,
     attempts, max_attempts, lease_token, lease_expires_at, leased_by, sent_at,
     provider_message_id, dead_reason, last_error, created_at)
VALUES
    ('otp', 'u1', 'a@x.io', 'a@x.io', 'login', 'otp', 'pending', 'pending', 0, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, now() - interval '3 days'),
    ('otp', 'u2', 'b@x.io', 'b@x.io', NULL, 'otp', 'held', 'processing', 1, 5,
     gen_random_uuid(), now() + interval '1 minute', 'w1', NULL, NULL, NULL, NULL, now()),
    ('invite', 'u3', 'c@x.io', 'c@x.io', NULL, 'invite', 'dead', 'dead', 3, NULL, NULL, NULL,
     'w2', NULL, NULL, 'rejected', '550 no such user', now() - interval '1 day'),
    ('otp', 'u4', 'd@x.io', 'd@x.io', NULL, 'otp', 'sent-traced', 'sent', 1, NULL, NULL, NULL,
     'w3', now() - interval '2 days', 'p-4', NULL, NULL, now() - interval '2 days'),
    ('otp', 'u5', 'e@x.io', 'e@x.io', NULL, 'otp', 'sent-before-0003', 'sent', 2, NULL, NULL,
     NULL, 'w4', now() - interval '5 days', 'p-5', NULL, NULL, now() - interval '5 days');
INSERT INTO leasebox.history (outbox_id, event, at, attempt, lease_token, worker_id,
                              provider_message_id)
SELECT id, e.event, created_at, 1, '00000000-0000-0000-0000-000000000004', 'w3',
       CASE e.event WHEN 'sent' THEN 'p-4' END
FROM leasebox.outbox CROSS JOIN (VALUES ('claimed'), ('sent')) AS e (event)
WHERE delivery_key = 'sent-traced';
INSERT INTO leasebox.receipts (scope, idempotency_key, request_hash, outbox_id, expires_at,
                               last_seen_at, reuse_count)
SELECT 'login', 'r1', 'h', id, now() + interval '20 days', now(), 2
FROM leasebox.outbox WHERE delivery_key = 'pending';
"""


def test_upgrading_a_populated_0003_schema_splits_queue_from_messages_and_keeps_every_fact(
    empty_db_dsn: str,
) -> None:
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA leasebox")
    migrated = migrate_to(empty_db_dsn, 3)
    assert migrated == [1, 2, 3]
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        for statement in UPGRADE_0003.split(";\n"):
            if statement.strip():
                conn.execute(statement)
        before: dict[str, int] = dict(
            conn.execute("SELECT delivery_key, id FROM leasebox.outbox").fetchall()
        )
        sent_at: dict[str, datetime] = dict(
            conn.execute(
                "SELECT delivery_key, sent_at FROM leasebox.outbox WHERE status = 'sent'"
            ).fetchall()
        )

    later = [m.version for m in available_migrations() if m.version > 3]
    assert [m.version for m in migrate(empty_db_dsn)] == later

    with psycopg.connect(empty_db_dsn) as conn:
        found = {
            key: (outbox_id, status, attempts, leased_by, provider_message_id, dead_reason)
            for key, outbox_id, status, attempts, leased_by, provider_message_id, dead_reason in (
                conn.execute(
                    "SELECT delivery_key, id, status, attempts, leased_by, provider_message_id,"
                    " dead_reason FROM leasebox.messages"
                ).fetchall()
            )
        }
        queued = conn.execute("SELECT delivery_key FROM leasebox.queue ORDER BY id").fetchall()
        sent_rows = conn.execute(
            "SELECT o.delivery_key, h.at, h.worker_id FROM leasebox.history AS h"
            " JOIN leasebox.outbox AS o ON o.id = h.outbox_id WHERE h.event = 'sent'"
            " ORDER BY o.id"
        ).fetchall()
        receipt = conn.execute(
            "SELECT outbox_id, bucket = (expires_at AT TIME ZONE 'UTC')::date, reuse_count"
            " FROM leasebox.receipts"
        ).fetchone()
        legacy = conn.execute("SELECT count(*) FROM leasebox.outbox_legacy").fetchone()
        defaults = conn.execute(
            "SELECT (SELECT count(*) FROM leasebox.receipts_default)"
            " + (SELECT count(*) FROM leasebox.outbox_default)"
        ).fetchone()
        fresh = enqueue(conn, otp("f@x.io"), cipher=SEALING)
    assert found == {
        "pending": (before["pending"], "pending", 0, None, None, None),
        "held": (before["held"], "processing", 1, "w1", None, None),
        "dead": (before["dead"], "dead", 3, "w2", None, "rejected"),
        "sent-traced": (before["sent-traced"], "sent", 1, "w3", "p-4", None),
        "sent-before-0003": (before["sent-before-0003"], "sent", 2, "w4", "p-5", None),
    }
    assert queued == [("pending",), ("held",), ("dead",)]
    # A send recorded before 0003 gets its `sent` row from what its outbox row recorded.
    assert sent_rows == [
        ("sent-traced", sent_at["sent-traced"], "w3"),
        ("sent-before-0003", sent_at["sent-before-0003"], "w4"),
    ]
    assert receipt == (before["pending"], True, 2)
    assert legacy == (5,)
    assert defaults == (0,)  # the receipt expiring in 20 days has its day's partition
    assert fresh.outbox_id > max(before.values())


def test_upgrading_a_0006_schema_keeps_its_superseded_messages_and_allows_suppressed_ones(
    empty_db_dsn: str,
) -> None:
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA leasebox")
    assert migrate_to(empty_db_dsn, 6) == [1, 2, 3, 4, 5, 6]
    with psycopg.connect(empty_db_dsn) as conn:
        old, new = (enqueue_at_0006(conn, key, "challenge-1") for key in ("old", "new"))

    assert [m.version for m in migrate(empty_db_dsn)] == [
        m.version for m in available_migrations() if m.version > 6
    ]

    with psycopg.connect(empty_db_dsn) as conn:
        # The widened event check keeps what 0006 allowed and takes what 0007 adds.
        conn.execute(
            "INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at)"
            " SELECT id, bucket, kind, 'suppressed', now() FROM leasebox.outbox WHERE id = %s",
            (new,),
        )
        conn.execute("DELETE FROM leasebox.queue WHERE id = %s", (new,))
        found = conn.execute(
            "SELECT id, status, superseded_by FROM leasebox.messages ORDER BY id"
        ).fetchall()
    assert found == [(old, "superseded", new), (new, "suppressed", None)]


# What a release at 0006 sent: its `enqueue_message` has no trace context (0008 adds it).
ENQUEUE_AT_0006 = """
SELECT outbox_id FROM leasebox.enqueue_message(
    p_kind => 'otp', p_aggregate_id => 'user-1', p_recipient => 'a@x.io',
    p_recipient_key => 'a@x.io', p_scope => NULL, p_message_hash => NULL, p_template => 'otp',
    p_data => '{"code": "123456"}', p_secrets => NULL, p_delivery_key => %(delivery_key)s,
    p_explicit_key => false, p_max_attempts => NULL, p_available_at => NULL,
    p_expires_at => NULL, p_idempotency_key => NULL, p_request_hash => NULL,
    p_ttl_seconds => NULL, p_locks => '{}', p_replacement_key => %(replacement_key)s
)
"""


def enqueue_at_0006(conn: psycopg.Connection[Any], delivery_key: str, replacement_key: str) -> int:
    """Enqueue one OTP through the schema's function as a producer of release 0006 called it."""
    row = conn.execute(
        ENQUEUE_AT_0006, {"delivery_key": delivery_key, "replacement_key": replacement_key}
    ).fetchone()
    assert row is not None
    return int(row[0])


def migrate_to(dsn: str, version: int) -> list[int]:
    """Apply leasebox's migrations up to `version` alone, as an older release would have."""
    applied = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE leasebox.schema_migrations (version integer PRIMARY KEY,"
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in (m for m in available_migrations() if m.version <= version):
            with conn.transaction():
                conn.execute(compose(migration.text(), "leasebox"))
                conn.execute(
                    "INSERT INTO leasebox.schema_migrations VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
            applied.append(migration.version)
    return applied
