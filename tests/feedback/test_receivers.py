"""Each service's receiver, sent requests signed exactly as that service signs them: a hard
bounce is stored once, linked to its message, and suppresses the mailbox in the message's
scope; a forged, unsigned, stale, replayed, malformed or oversized request gets a 4xx and
stores nothing; forty redeliveries of one event under new ids store it once; events out of
order are all kept; a database that cannot store is a 5xx."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from leasebox.feedback.receiver import Receivers
from support.feedback_rig import Hooks, SentMessage, Signers, stored
from support.mail_webhooks import (
    MailgunSigner,
    PostmarkCredentials,
    ResendSigner,
    SendGridSigner,
    SnsSigner,
)

Request = tuple[dict[str, str], bytes]
# The key of someone who made a certificate of their own: it names the real certificate URL.
FORGER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass(frozen=True)
class Service:
    """How a service sends a hard bounce of `message` (at a time, under a fresh event id),
    and the same signed with a key of someone else's."""

    name: str
    bounce: Callable[[Signers, SentMessage, dt.datetime], Request]
    forged: Callable[[Signers, SentMessage, dt.datetime], Request]
    unsigned: Callable[[Request], Request]


def _without(request: Request, name: str) -> Request:
    """The request with one field of its JSON body left out (a signature in the body)."""
    fields = json.loads(request[1])
    del fields[name]
    return request[0], json.dumps(fields).encode()


def _drop(request: Request, *names: str) -> Request:
    headers, body = request
    return {k: v for k, v in headers.items() if k.lower() not in names}, body


SERVICES = [
    Service(
        "ses",
        lambda s, m, at: s.sns.message(
            SnsSigner.bounce(m.provider_message_id, m.recipient, at), at
        ),
        lambda s, m, at: SnsSigner(s.sns.server, key=FORGER_KEY).message(
            SnsSigner.bounce(m.provider_message_id, m.recipient, at), at
        ),
        lambda r: (
            r[0],
            json.dumps({k: v for k, v in json.loads(r[1]).items() if k != "Signature"}).encode(),
        ),
    ),
    Service(
        "sendgrid",
        lambda s, m, at: s.sendgrid.request(
            [
                SendGridSigner.event(
                    "bounce",
                    m.provider_message_id,
                    m.recipient,
                    at,
                    type="bounce",
                    status="5.1.1",
                    reason="550 5.1.1 unknown",
                )
            ],
            at,
        ),
        lambda s, m, at: SendGridSigner().request(
            [SendGridSigner.event("bounce", m.provider_message_id, m.recipient, at)], at
        ),
        lambda r: _drop(r, "x-twilio-email-event-webhook-signature"),
    ),
    Service(
        "postmark",
        lambda s, m, at: s.postmark.request(
            PostmarkCredentials.bounce(m.provider_message_id, m.recipient, at)
        ),
        lambda s, m, at: PostmarkCredentials(password="guessed").request(
            PostmarkCredentials.bounce(m.provider_message_id, m.recipient, at)
        ),
        lambda r: _drop(r, "authorization"),
    ),
    Service(
        "mailgun",
        lambda s, m, at: s.mailgun.request(
            MailgunSigner.failed(f"<{m.provider_message_id}>", m.recipient, at), at
        ),
        lambda s, m, at: MailgunSigner().request(
            MailgunSigner.failed(m.provider_message_id, m.recipient, at), at
        ),
        lambda r: (
            r[0],
            json.dumps({k: v for k, v in json.loads(r[1]).items() if k != "signature"}).encode(),
        ),
    ),
    Service(
        "resend",
        lambda s, m, at: s.resend.request(
            ResendSigner.event(
                "email.bounced",
                m.provider_message_id,
                m.recipient,
                at,
                bounce={
                    "type": "Permanent",
                    "subType": "General",
                    "message": "550 5.1.1 mailbox does not exist",
                },
            ),
            at,
        ),
        lambda s, m, at: ResendSigner().request(
            ResendSigner.event("email.bounced", m.provider_message_id, m.recipient, at), at
        ),
        lambda r: _drop(r, "svix-signature"),
    ),
]
IDS = [s.name for s in SERVICES]


def events(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return stored(
        conn,
        "SELECT provider, event, bounce_class, smtp_status, recipient_key, outbox_id, scope"
        " FROM leasebox.events ORDER BY id",
    )


def suppressions(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return stored(
        conn, "SELECT scope, recipient_key, reason, expires_at IS NULL FROM leasebox.suppressions"
    )


@pytest.fixture(params=SERVICES, ids=IDS)
def service(request: pytest.FixtureRequest) -> Service:
    chosen: Service = request.param
    return chosen


async def test_a_signed_hard_bounce_is_stored_linked_and_suppresses_the_mailbox(
    now: dt.datetime,
    service: Service,
    signers: Signers,
    hooks: Hooks,
    sent: Callable[..., SentMessage],
    db_conn: psycopg.Connection[Any],
) -> None:
    message = sent(f"{service.name}-msg-1")
    answer = await hooks.post(service.name, service.bounce(signers, message, now))

    assert (answer.status, answer.text) == (200, "stored 1 of 1")
    [(provider, event, bounce_class, status, mailbox, outbox_id, scope)] = events(db_conn)
    assert (provider, event, bounce_class, mailbox) == (
        service.name,
        "bounced",
        "hard",
        "gone@example.org",
    )
    assert status == "5.1.1"
    assert (outbox_id, scope) == (message.id, "login")
    assert suppressions(db_conn) == [("login", "gone@example.org", "hard_bounce", False)]
    labels = {
        "provider": service.name,
        "sending_domain": _domain(service.name),
        "mailbox_provider": "other",
        "event": "bounced_hard",
    }
    assert hooks.value("leasebox_feedback_events_total", labels) == 1


def _domain(service: str) -> str:
    return {"sendgrid": "", "mailgun": "mg.example.com"}.get(service, "mail.example.com")


async def test_forged_unsigned_and_stale_requests_are_refused_and_store_nothing(
    now: dt.datetime,
    service: Service,
    signers: Signers,
    hooks: Hooks,
    sent: Callable[..., SentMessage],
    db_conn: psycopg.Connection[Any],
) -> None:
    message = sent(f"{service.name}-msg-2")
    forged = await hooks.post(service.name, service.forged(signers, message, now))
    unsigned = await hooks.post(
        service.name, service.unsigned(service.bounce(signers, message, now))
    )
    answers = [forged.status, unsigned.status]
    if service.name != "postmark":  # basic auth has no time to be stale
        stale = await hooks.post(
            service.name, service.bounce(signers, message, now - dt.timedelta(hours=2))
        )
        answers.append(stale.status)
        assert stale.text == "stale"

    assert all(400 <= status < 500 for status in answers), answers
    assert forged.status in (401, 403)
    assert events(db_conn) == []
    assert suppressions(db_conn) == []
    if service.name == "postmark":
        assert forged.headers["WWW-Authenticate"].startswith("Basic")


async def test_forty_redeliveries_of_one_event_under_new_ids_store_it_once(
    now: dt.datetime,
    service: Service,
    signers: Signers,
    hooks: Hooks,
    sent: Callable[..., SentMessage],
    db_conn: psycopg.Connection[Any],
) -> None:
    message = sent(f"{service.name}-msg-3")
    answers = [
        await hooks.post(service.name, service.bounce(signers, message, now)) for _ in range(40)
    ]

    assert [a.status for a in answers] == [200] * 40
    assert answers[0].text == "stored 1 of 1"
    assert {a.text for a in answers[1:]} == {"stored 0 of 1"}
    assert len(events(db_conn)) == 1
    assert hooks.value("leasebox_feedback_duplicate_events_total", {"provider": service.name}) == 39
    hour = stored(db_conn, "SELECT outcome, events FROM leasebox.feedback_hours")
    assert hour == [("bounced_hard", 1)]


async def test_a_request_replayed_byte_for_byte_stores_nothing_more(
    now: dt.datetime,
    service: Service,
    signers: Signers,
    hooks: Hooks,
    sent: Callable[..., SentMessage],
    db_conn: psycopg.Connection[Any],
) -> None:
    message = sent(f"{service.name}-msg-4")
    request = service.bounce(signers, message, now)
    first = await hooks.post(service.name, request)
    again = await hooks.post(service.name, request)

    assert first.status == 200
    if service.name == "mailgun":  # its token is remembered: a replay is refused
        assert (again.status, again.text) == (409, "replayed")
    else:  # the others redeliver the same request: acknowledged, nothing new
        assert (again.status, again.text) == (200, "stored 0 of 1")
    assert len(events(db_conn)) == 1


async def test_malformed_and_oversized_bodies_are_refused(
    now: dt.datetime,
    service: Service,
    signers: Signers,
    hooks: Hooks,
    sent: Callable[..., SentMessage],
    db_conn: psycopg.Connection[Any],
) -> None:
    headers, _ = service.bounce(signers, sent(f"{service.name}-msg-5"), now)
    garbage = b"{not json"
    if service.name == "sendgrid":
        headers = signers.sendgrid.sign(garbage, str(int(now.timestamp())))
    elif service.name == "resend":
        headers = signers.resend.sign(garbage, now, "msg_garbage")
    malformed = await hooks.post(service.name, (headers, garbage))
    huge = await hooks.post(service.name, (headers, b"[" + b" " * 70_000 + b"]"))

    assert malformed.status == 400, malformed.text
    assert (huge.status, huge.text) == (413, "too_large")
    assert events(db_conn) == []


async def test_a_database_that_cannot_store_is_a_5xx_so_the_service_retries(
    now: dt.datetime,
    service: Service,
    signers: Signers,
    make_hooks: Callable[..., Any],
    sent: Callable[..., SentMessage],
    db_conn: psycopg.Connection[Any],
) -> None:
    message = sent(f"{service.name}-msg-6")
    async with make_hooks(schema="not_migrated") as broken:
        answer = await broken.post(service.name, service.bounce(signers, message, now))
    assert (answer.status, answer.text) == (503, "storage_unavailable")
    assert events(db_conn) == []


async def test_events_out_of_order_are_all_kept_and_soft_bounces_add_up(
    now: dt.datetime,
    signers: Signers,
    hooks: Hooks,
    sent: Callable[..., SentMessage],
    db_conn: psycopg.Connection[Any],
) -> None:
    message = sent("sg-order", recipient="full@example.org")
    at = [now - dt.timedelta(hours=h) for h in (1, 30, 5)]  # newest first, then older ones
    for when in at:
        blocked = SendGridSigner.event(
            "bounce",
            "sg-order",
            message.recipient,
            when,
            type="blocked",
            status="4.2.2",
            reason="mailbox full",
        )
        assert (
            await hooks.post("sendgrid", signers.sendgrid.request([blocked], now))
        ).status == 200
    delivered = SendGridSigner.event(
        "delivered", "sg-order", message.recipient, now - dt.timedelta(hours=40)
    )
    await hooks.post("sendgrid", signers.sendgrid.request([delivered], now))

    kept = events(db_conn)
    assert [(e[1], e[2]) for e in kept] == [("bounced", "soft")] * 3 + [("delivered", None)]
    [(scope, mailbox, reason, forever)] = suppressions(db_conn)
    assert (scope, mailbox, reason, forever) == ("login", "full@example.org", "soft_bounces", False)


async def test_an_event_about_an_unknown_message_is_kept_and_counted_not_suppressing(
    now: dt.datetime, signers: Signers, hooks: Hooks, db_conn: psycopg.Connection[Any]
) -> None:
    complaint = ResendSigner.event("email.complained", "re_unknown", "who@example.org", now)
    answer = await hooks.post("resend", signers.resend.request(complaint, now))

    assert answer.status == 200
    assert events(db_conn) == [("resend", "complained", None, None, "who@example.org", None, None)]
    assert suppressions(db_conn) == []
    assert (
        hooks.value("leasebox_feedback_unknown_message_events_total", {"provider": "resend"}) == 1
    )


async def test_a_service_without_secrets_is_not_served(
    now: dt.datetime,
    make_hooks: Callable[..., Any],
    signers: Signers,
    sent: Callable[..., SentMessage],
) -> None:
    message = sent("only-resend")
    request = SERVICES[1].bounce(signers, message, now)
    async with make_hooks(receivers=Receivers(resend=None)) as bare:
        answer = await bare.post("sendgrid", request)
        odd = await bare.post("../../etc", request)
        metrics = await bare.session.get(f"{bare.base}/metrics")
        text = await metrics.text()
    assert (answer.status, odd.status) == (404, 404)
    assert 'provider="unknown"' in text
