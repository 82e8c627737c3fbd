"""Every ORM integration has the semantics of `leasebox.enqueue`, on real PostgreSQL.

Each test runs once per variant: SQLAlchemy `Session` and `Connection` on psycopg 3,
`AsyncSession` on psycopg 3 and on asyncpg, `AsyncConnection` on asyncpg, and Django inside
`transaction.atomic()`. The observer is a separate psycopg connection, so "visible" means
committed.
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import leasebox
import leasebox.django
import leasebox.sqlalchemy
from leasebox import AbuseGuard, IdempotencyConflict, OutboxMessage, RateLimited
from leasebox.producer.payload_crypto import PayloadCipher, generate_key
from support.orm_producers import Producer


def otp(recipient: str = "ada@example.com", **overrides: Any) -> OutboxMessage:
    fields: dict[str, Any] = {
        "kind": "otp",
        "recipient": recipient,
        "aggregate_id": "user-1",
        "data": {"minutes_valid": 10, "nested": {"list": [1, 2]}},
        "secrets": {"code": "493817"},
        "expires_at": datetime.now(UTC) + timedelta(minutes=10),
        "max_attempts": 5,
    }
    fields.update(overrides)
    return OutboxMessage(**fields)


def rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as observer:
        return observer.execute(
            "SELECT id, recipient, data, max_attempts, expires_at IS NOT NULL, status"
            " FROM leasebox.messages ORDER BY id"
        ).fetchall()


def receipts(dsn: str) -> int:
    with psycopg.connect(dsn) as observer:
        row = observer.execute("SELECT count(*) FROM leasebox.receipts").fetchone()
    assert row is not None
    return int(row[0])


def test_the_row_is_invisible_until_the_orm_commits_and_then_complete(
    orm_producer: Producer, db_dsn: str
) -> None:
    receipt = orm_producer.enqueue(otp(), idempotency_key="k1", scope="login")

    assert rows(db_dsn) == [], "visible before the caller committed"
    orm_producer.commit()

    assert rows(db_dsn) == [
        (
            receipt.outbox_id,
            "ada@example.com",
            {"minutes_valid": 10, "nested": {"list": [1, 2]}},
            5,
            True,
            "pending",
        )
    ]
    assert receipts(db_dsn) == 1
    assert receipt.reused is False


def test_a_rollback_leaves_neither_row_nor_receipt(orm_producer: Producer, db_dsn: str) -> None:
    orm_producer.enqueue(otp(), idempotency_key="k1", scope="login")
    orm_producer.rollback()

    assert rows(db_dsn) == []
    assert receipts(db_dsn) == 0


def test_a_retried_request_reuses_the_receipt(orm_producer: Producer, db_dsn: str) -> None:
    first = orm_producer.enqueue(otp(), idempotency_key="k1", scope="login")
    orm_producer.commit()

    retried = orm_producer.enqueue(
        otp(secrets={"code": "111111"}), idempotency_key="k1", scope="login"
    )
    orm_producer.commit()

    assert (retried.outbox_id, retried.delivery_key) == (first.outbox_id, first.delivery_key)
    assert retried.reused is True
    assert len(rows(db_dsn)) == 1


def test_the_same_key_with_another_request_raises_a_conflict(
    orm_producer: Producer, db_dsn: str
) -> None:
    first = orm_producer.enqueue(otp(), idempotency_key="k1", scope="login")
    orm_producer.commit()

    with pytest.raises(IdempotencyConflict) as caught:
        orm_producer.enqueue(otp("eve@example.com"), idempotency_key="k1", scope="login")
    orm_producer.rollback()

    assert caught.value.outbox_id == first.outbox_id
    assert [row[1] for row in rows(db_dsn)] == ["ada@example.com"]


def test_the_abuse_guard_refuses_past_its_limit(orm_producer: Producer, db_dsn: str) -> None:
    guard = AbuseGuard(per_recipient=2, window_seconds=600)
    for n in range(2):
        orm_producer.enqueue(otp(), idempotency_key=f"k{n}", scope="login", guard=guard)
        orm_producer.commit()

    with pytest.raises(RateLimited) as caught:
        orm_producer.enqueue(otp(), idempotency_key="k2", scope="login", guard=guard)
    orm_producer.rollback()

    assert caught.value.limit_name == "per-recipient"
    assert 0 < caught.value.retry_after <= 600
    assert len(rows(db_dsn)) == 2


def test_secrets_are_sealed_with_the_given_keys(orm_producer: Producer, db_dsn: str) -> None:
    cipher = PayloadCipher([generate_key()])
    receipt = orm_producer.enqueue(otp(), cipher=cipher)
    orm_producer.commit()

    with psycopg.connect(db_dsn) as observer:
        found = observer.execute(
            "SELECT secrets FROM leasebox.outbox WHERE id = %s", (receipt.outbox_id,)
        ).fetchone()
    assert found is not None
    sealed = bytes(found[0])
    assert sealed.startswith(b"f1:")
    assert b"493817" not in sealed
    assert cipher.open(sealed) == {"code": "493817"}


def test_optional_fields_left_unset_are_written_as_nulls_and_defaults(
    orm_producer: Producer, db_dsn: str
) -> None:
    link = {"link": "https://example.com/v/1"}  # what the template needs, nothing optional
    orm_producer.enqueue(OutboxMessage(kind="verification", recipient="bo@example.com", data=link))
    orm_producer.commit()

    with psycopg.connect(db_dsn) as observer:
        found = observer.execute(
            "SELECT o.aggregate_id, o.data, o.secrets, o.max_attempts, o.expires_at,"
            " q.available_at <= now() FROM leasebox.outbox AS o JOIN leasebox.queue AS q USING (id)"
        ).fetchone()
    assert found == (None, link, None, None, None, True)


@pytest.mark.parametrize(
    "adapter",
    [leasebox.sqlalchemy.enqueue, leasebox.sqlalchemy.enqueue_async, leasebox.django.enqueue],
)
def test_the_adapters_take_the_keyword_arguments_of_leasebox_enqueue(adapter: Any) -> None:
    def keywords(function: Any) -> set[str]:
        return {
            name
            for name, parameter in inspect.signature(function).parameters.items()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        }

    assert keywords(leasebox.enqueue) <= keywords(adapter)
    assert keywords(adapter) - keywords(leasebox.enqueue) <= {"using"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kind": "newsletter", "template": "otp"}, "kind"),
        ({"template": "welcome"}, "template"),
        ({"secrets": {}}, "code"),
    ],
    ids=["unknown kind", "unknown template", "missing variable"],
)
def test_every_adapter_refuses_what_no_worker_could_send_and_writes_nothing(
    orm_producer: Producer, db_dsn: str, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(leasebox.InvalidMessage) as caught:
        orm_producer.enqueue(otp(**fields), idempotency_key="k1")
    orm_producer.commit()
    assert caught.value.field == field
    assert (rows(db_dsn), receipts(db_dsn)) == ([], 0)


def test_every_adapter_checks_against_the_catalogue_it_is_given(
    orm_producer: Producer, db_dsn: str
) -> None:
    catalogue = leasebox.Catalogue()
    catalogue.register_kind("newsletter")
    catalogue.register_template("newsletter", required=["issue"])
    orm_producer.enqueue(
        OutboxMessage(kind="newsletter", recipient="bo@example.com", data={"issue": 7}),
        catalogue=catalogue,
    )
    orm_producer.commit()
    assert [row[2] for row in rows(db_dsn)] == [{"issue": 7}]


def test_a_resent_code_supersedes_the_pending_one_through_every_orm(
    orm_producer: Producer, db_dsn: str
) -> None:
    old = orm_producer.enqueue(otp(replacement_key="challenge-7"))
    orm_producer.commit()

    new = orm_producer.enqueue(otp(replacement_key="challenge-7"))
    orm_producer.commit()

    with psycopg.connect(db_dsn) as observer:
        found = observer.execute(
            "SELECT id, status, superseded_by FROM leasebox.messages ORDER BY id"
        ).fetchall()
    assert found == [
        (old.outbox_id, "superseded", new.outbox_id),
        (new.outbox_id, "pending", None),
    ]


def test_every_adapter_refuses_a_suppressed_mailbox_and_a_refused_domain(
    orm_producer: Producer, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn) as conn:
        conn.execute(
            "INSERT INTO leasebox.suppressions (scope, recipient_key, reason)"
            " VALUES ('login', 'ada@example.com', 'hard_bounce')"
        )
    with pytest.raises(leasebox.RecipientSuppressed):
        orm_producer.enqueue(otp(), scope="login", check_suppression=True)
    orm_producer.rollback()
    with pytest.raises(leasebox.RecipientRefused):
        orm_producer.enqueue(
            OutboxMessage(kind="otp", recipient="ada@mailinator.com"),
            policy=leasebox.RecipientPolicy(),
        )
    orm_producer.rollback()
    orm_producer.enqueue(otp(), scope="signup", check_suppression=True)
    orm_producer.commit()
    assert len(rows(db_dsn)) == 1
