"""`enqueue` and `enqueue_many` refuse a message no worker could send, before any SQL.

An unknown kind (no pool claims it), an unknown template, or a variable the template needs
and the message lacks used to be written and dead-lettered later as `invalid_message`, long
after the API answered 202. Each is now an `InvalidMessage` naming the field, checked against
the application's catalogue (the built-ins and what it registers), and nothing is written.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import leasebox
import leasebox.catalogue
from leasebox import Catalogue, InvalidMessage, OutboxMessage
from leasebox.errors import ConfigurationError
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from support.outbox_rows import count

LINK = {"link": "https://example.com/v/1"}
# A message of each kind of mistake, and the field its one line names.
REFUSED = {
    "unknown kind": (
        {"kind": "newsletter", "template": "verification", "data": LINK},
        "kind",
        "'newsletter' is not a registered kind",
    ),
    "unknown template": (
        {"kind": "verification", "template": "verifcation", "data": LINK},
        "template",
        "'verifcation' is not a registered template",
    ),
    "missing variable": (
        {"kind": "otp", "data": {"minutes_valid": 10}},
        "code",
        "the 'otp' template needs this variable; give it in data or secrets",
    ),
    "missing variables": (
        {"kind": "invite", "data": {"name": "Bo"}},
        "inviter",
        "the 'invite' template needs this variable; give it in data or secrets (and 1 more: link)",
    ),
}


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")


@pytest.fixture
def process_catalogue(monkeypatch: pytest.MonkeyPatch) -> Catalogue:
    """A fresh process-wide catalogue, so registrations do not outlive the test."""
    fresh = Catalogue()
    monkeypatch.setattr(leasebox.catalogue, "DEFAULT_CATALOGUE", fresh)
    return fresh


def message(**fields: Any) -> OutboxMessage:
    return OutboxMessage(recipient="ada@example.com", **fields)


@pytest.mark.parametrize("case", REFUSED)
def test_enqueue_refuses_with_one_line_naming_the_field_and_writes_nothing(
    db_conn: psycopg.Connection[Any], case: str
) -> None:
    fields, field, problem = REFUSED[case]
    with pytest.raises(InvalidMessage) as caught:
        leasebox.enqueue(db_conn, message(**fields), idempotency_key="k1")
    db_conn.commit()
    assert caught.value.field == field
    assert str(caught.value).startswith(f"invalid message: {field}: {problem}")
    assert "\n" not in str(caught.value)
    assert (count(db_conn, "outbox"), count(db_conn, "receipts")) == (0, 0)


@pytest.mark.parametrize("case", REFUSED)
async def test_enqueue_async_refuses_the_same(db_dsn: str, case: str) -> None:
    fields, field, _ = REFUSED[case]
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        with pytest.raises(InvalidMessage) as caught:
            await leasebox.enqueue_async(conn, message(**fields))
        await conn.commit()
    assert caught.value.field == field
    with psycopg.connect(db_dsn) as conn:
        assert count(conn, "outbox") == 0


def test_a_batch_with_refused_messages_writes_none_of_it_and_names_each_by_position(
    db_conn: psycopg.Connection[Any],
) -> None:
    good = message(kind="verification", data=LINK)
    batch = [
        good,
        message(**REFUSED["missing variable"][0]),
        good,
        message(**REFUSED["unknown template"][0]),
    ]
    with pytest.raises(InvalidMessage) as caught:
        leasebox.enqueue_many(db_conn, batch)
    db_conn.commit()
    assert str(caught.value) == (
        "invalid message: messages[1].code: the 'otp' template needs this variable; give it "
        "in data or secrets (and 1 more: messages[3].template)"
    )
    assert caught.value.fields == ("messages[1].code", "messages[3].template")
    assert count(db_conn, "outbox") == 0


async def test_an_async_batch_is_refused_the_same(db_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        with pytest.raises(InvalidMessage, match=r"messages\[0\]\.kind"):
            await leasebox.enqueue_many_async(conn, [message(**REFUSED["unknown kind"][0])])


def test_a_registered_kind_and_template_are_accepted_with_their_required_variables(
    db_conn: psycopg.Connection[Any], process_catalogue: Catalogue
) -> None:
    newsletter = message(kind="newsletter", template="acme/digest", data={"issue": 7})
    with pytest.raises(InvalidMessage, match="kind"):
        leasebox.enqueue(db_conn, newsletter)
    leasebox.register_kind("newsletter")
    leasebox.register_template("acme/digest", required=["issue"], optional=["name"])
    leasebox.enqueue(db_conn, newsletter)
    leasebox.enqueue_many(db_conn, [newsletter, message(kind="verification", data=LINK)])
    with pytest.raises(InvalidMessage, match=r"^invalid message: issue: "):
        leasebox.enqueue(db_conn, message(kind="newsletter", template="acme/digest"))
    db_conn.commit()
    assert count(db_conn, "outbox") == 3
    assert process_catalogue.template("acme/digest") == leasebox.TemplateSpec(
        "acme/digest", frozenset({"issue"}), frozenset({"name"})
    )


def test_a_catalogue_given_to_enqueue_replaces_the_process_wide_one(
    db_conn: psycopg.Connection[Any],
) -> None:
    strict = Catalogue()
    strict.register_template("otp", required=["code", "name"])  # an override needs a name
    with pytest.raises(InvalidMessage, match=r"^invalid message: name: "):
        leasebox.enqueue(db_conn, message(kind="otp", secrets={"code": "493817"}), catalogue=strict)
    leasebox.enqueue(db_conn, message(kind="otp", secrets={"code": "493817"}))
    db_conn.commit()
    assert count(db_conn, "outbox") == 1


@pytest.mark.parametrize(
    ("register", "error"),
    [
        (lambda c: c.register_kind("Newsletter"), "kind 'Newsletter' is not valid"),
        (lambda c: c.register_template("../x"), "template name '../x' is not valid"),
        (lambda c: c.register_template("x", required="code"), "lists of variable names"),
        (lambda c: c.register_template("x", required=["a-b"]), "'a-b' is not a valid"),
        (
            lambda c: c.register_template("x", required=["a"], optional=["a"]),
            "declares 'a' both required and optional",
        ),
    ],
)
def test_a_malformed_registration_is_a_configuration_error(register: Any, error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        register(Catalogue())
