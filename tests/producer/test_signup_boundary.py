"""The producer's side of suppression and the domain policy: a listed mailbox or a refused
domain is refused at `enqueue` with a reason and nothing is written; an application lifts an
entry once the user proved the address works; one mailbox is one recipient however it is
spelt, for the abuse guard as for the list."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import leasebox
from leasebox import (
    AbuseGuard,
    RateLimited,
    RecipientPolicy,
    RecipientRefused,
    RecipientSuppressed,
    enqueue,
    enqueue_async,
)
from leasebox.addresses import mailbox_key
from leasebox.store.suppressions import Entry, add_suppressions, list_suppressions
from support.dns_server import Zone, dns_server
from support.outbox_rows import SEALING, otp


def outbox_rows(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("A.B+x@GMail.com", "ab@gmail.com"),
        ("a.b@googlemail.com", "ab@gmail.com"),
        ("Ada+news@Outlook.com", "ada@outlook.com"),
        ("a.da@outlook.com", "a.da@outlook.com"),  # Outlook reads dots
        ("a.b+x@example.com", "a.b+x@example.com"),  # unknown rules: only case and IDNA
        ("ADA@Bücher.de", "ada@xn--bcher-kva.de"),
        ("+tag@gmail.com", "+tag@gmail.com"),
    ],
)
def test_the_mailbox_key_folds_only_what_the_domain_ignores(given: str, key: str) -> None:
    assert mailbox_key(given) == key
    assert otp(given).recipient_key == key


def test_a_dotted_tagged_gmail_address_shares_the_limit_of_its_mailbox(
    db_conn: psycopg.Connection[Any],
) -> None:
    guard = AbuseGuard(per_recipient=1, window_seconds=3600)
    enqueue(db_conn, otp("ab@gmail.com"), cipher=SEALING, guard=guard)
    db_conn.commit()
    with pytest.raises(RateLimited):
        enqueue(db_conn, otp("A.B+x@gmail.com"), cipher=SEALING, guard=guard)
    db_conn.rollback()
    assert outbox_rows(db_conn) == 1


def test_enqueue_refuses_a_suppressed_mailbox_and_writes_nothing(
    db_conn: psycopg.Connection[Any],
) -> None:
    add_suppressions(db_conn, [Entry("a.b@gmail.com", scope="login", reason="hard_bounce")])
    with pytest.raises(RecipientSuppressed) as caught:
        enqueue(
            db_conn,
            otp("AB+retry@gmail.com"),
            cipher=SEALING,
            scope="login",
            check_suppression=True,
        )
    db_conn.rollback()
    assert caught.value.reason == "hard_bounce"
    assert caught.value.expires_at is None
    assert "gmail" not in str(caught.value)
    assert outbox_rows(db_conn) == 0
    # Another scope's list, or no check asked for: written (the worker still checks at claim).
    enqueue(db_conn, otp("ab@gmail.com"), cipher=SEALING, scope="signup", check_suppression=True)
    enqueue(db_conn, otp("ab@gmail.com"), cipher=SEALING, scope="login")
    db_conn.commit()
    assert outbox_rows(db_conn) == 2


def test_an_expired_entry_refuses_nothing(db_conn: psycopg.Connection[Any]) -> None:
    row = db_conn.execute("SELECT now()").fetchone()
    assert row is not None
    add_suppressions(db_conn, [Entry("ada@example.org", expires_at=row[0] - timedelta(seconds=1))])
    enqueue(db_conn, otp("ada@example.org"), cipher=SEALING, check_suppression=True)
    db_conn.commit()
    assert outbox_rows(db_conn) == 1


async def test_lifting_an_entry_lets_the_next_enqueue_through(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    add_suppressions(db_conn, [Entry("ada@example.org", reason="hard_bounce")])
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        with pytest.raises(RecipientSuppressed):
            await enqueue_async(
                conn, otp("ada@example.org"), cipher=SEALING, check_suppression=True
            )
        await conn.rollback()
        # The user proved the address works (clicked a link sent another way): lift, then send.
        assert await leasebox.lift_suppression_async(conn, "Ada@Example.org") == "hard_bounce"
        await enqueue_async(conn, otp("ada@example.org"), cipher=SEALING, check_suppression=True)
        await conn.commit()
    assert list_suppressions(db_conn) == []
    assert outbox_rows(db_conn) == 1
    assert leasebox.lift_suppression(db_conn, "ada@example.org") is None


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("ada@mailinator.com", "disposable_domain"),
        ("ada@eu.mailinator.com", "disposable_domain"),  # a subdomain of a listed one
        ("ada@throwaway.example.net", "invalid_domain"),  # reserved names receive nothing
        ("ada@host.invalid", "invalid_domain"),
        ("ada@printer.local", "invalid_domain"),
        ("ada@10.0.0.1", "invalid_domain"),
        ("ada@burner.test", "invalid_domain"),
    ],
)
def test_the_domain_policy_refuses_with_a_reason_and_writes_nothing(
    db_conn: psycopg.Connection[Any], address: str, reason: str
) -> None:
    with pytest.raises(RecipientRefused) as caught:
        enqueue(db_conn, otp(address), cipher=SEALING, policy=RecipientPolicy())
    db_conn.rollback()
    assert caught.value.reason == reason
    assert address.split("@")[1] not in str(caught.value)
    assert outbox_rows(db_conn) == 0


def test_the_policy_passes_ordinary_addresses_and_what_its_allowlist_names(
    db_conn: psycopg.Connection[Any],
) -> None:
    policy = RecipientPolicy(allow=frozenset({"mailinator.com"}), refuse=frozenset({"spam.io"}))
    enqueue(db_conn, otp("ada@mailinator.com"), cipher=SEALING, policy=policy)
    enqueue(db_conn, otp("ada@gmail.com"), cipher=SEALING, policy=policy)
    with pytest.raises(RecipientRefused):
        policy.check("ada@mx.spam.io")
    assert RecipientPolicy(refuse_disposable=False).local_verdict("a@yopmail.com") is None
    db_conn.commit()
    assert outbox_rows(db_conn) == 2


ZONE = Zone(
    {
        "mail.org.": {"MX": ["10 mx.mail.org."]},
        "nullmx.org.": {"MX": ["0 ."]},
        "bare.org.": {"A": ["192.0.2.7"]},  # no MX: its own address takes mail
        "parked.org.": {"TXT": ['"for sale"']},  # neither MX nor an address
    },
    silent=frozenset({"slow.org."}),
)


@pytest.mark.parametrize(
    ("domain", "refused"),
    [
        ("mail.org", None),
        ("bare.org", None),
        ("slow.org", None),  # DNS does not answer in time: fails open
        ("nullmx.org", "no_mail_server"),
        ("parked.org", "no_mail_server"),
        ("absent.org", "no_mail_server"),
    ],
)
async def test_the_mx_check_refuses_only_what_dns_says_takes_no_mail(
    domain: str, refused: str | None
) -> None:
    with dns_server(ZONE) as port:
        policy = RecipientPolicy(
            check_mx=True,
            refuse_disposable=False,
            mx_timeout=0.3,
            nameservers=("127.0.0.1",),
            dns_port=port,
        )
        outcomes: list[str | None] = []
        for check in (policy.check, policy.check_async):
            try:
                result = check(f"ada@{domain}")
                if result is not None:
                    await result
                outcomes.append(None)
            except RecipientRefused as exc:
                outcomes.append(exc.reason)
    assert outcomes == [refused, refused]
    assert f"{domain}. MX" in ZONE.asked


def test_the_default_policy_makes_no_dns_lookup() -> None:
    before = len(ZONE.asked)
    with dns_server(ZONE) as port:
        RecipientPolicy(nameservers=("127.0.0.1",), dns_port=port).check("ada@absent.org")
    assert len(ZONE.asked) == before
