"""The same receivers behind their other faces: mounted in a FastAPI app, and as a Django
view; and the whole loop: a hard bounce arrives, and the next OTP to that address ends
`suppressed` without reaching the provider."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import psycopg
import pytest
from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool

from leasebox import OutboxMessage, enqueue
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.feedback.asgi import FeedbackApp
from leasebox.feedback.receiver import Receivers
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.worker import Worker
from support.feedback_rig import Signers, serve, stored
from support.mail_webhooks import PostmarkCredentials, ResendSigner
from support.orm_producers import add_django_database, configure_django, remove_django_database
from support.running_worker import SETTINGS
from support.worker_doubles import ScriptedProvider


async def test_the_app_works_mounted_in_a_fastapi_application(
    now: dt.datetime,
    receivers: Receivers,
    signers: Signers,
    db_dsn: str,
    sent: Any,
    db_conn: psycopg.Connection[Any],
) -> None:
    sent("re_mounted", recipient="ada@example.org")
    hooks = FeedbackApp(receivers, dsn=db_dsn)
    api = FastAPI()
    api.mount("/hooks/mail", hooks)
    event = ResendSigner.event("email.delivered", "re_mounted", "ada@example.org", now)
    headers, body = signers.resend.request(event, now)
    async with serve(api) as base, aiohttp.ClientSession() as session:
        async with session.post(f"{base}/hooks/mail/resend", data=body, headers=headers) as r:
            status, text = r.status, await r.text()
        async with session.get(f"{base}/hooks/mail/healthz") as r:
            health = r.status
    await hooks.close()
    assert (status, text.strip(), health) == (200, "stored 1 of 1", 200)
    assert stored(db_conn, "SELECT event, outbox_id IS NOT NULL FROM leasebox.events") == [
        ("delivered", True)
    ]


@pytest.fixture
def django_alias(db_dsn: str) -> Iterator[str]:
    configure_django()
    alias = add_django_database(db_dsn)
    yield alias
    remove_django_database(alias)


def test_the_django_view_stores_a_postmark_bounce_and_refuses_bad_credentials(
    now: dt.datetime,
    receivers: Receivers,
    signers: Signers,
    django_alias: str,
    sent: Any,
    db_conn: psycopg.Connection[Any],
) -> None:
    from django.test import RequestFactory

    from leasebox.feedback.django import feedback_view

    sent("pm-1", recipient="gone@example.org", scope="signup")
    view = feedback_view(receivers, using=django_alias)
    headers, body = signers.postmark.request(
        PostmarkCredentials.bounce("pm-1", "Gone@Example.org", now)
    )
    factory = RequestFactory()

    def post(auth: str) -> Any:
        request = factory.post(
            "/hooks/postmark", data=body, content_type="application/json",
            HTTP_AUTHORIZATION=auth,
        )  # fmt: skip
        return view(request, service="postmark")

    refused = post("Basic " + "bm9ib2R5Ondyb25n")
    accepted = post(headers["Authorization"])
    again = post(headers["Authorization"])
    oversized = view(factory.post("/x", data=b"x" * 70_000, content_type="text/plain"), "postmark")

    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Basic")
    assert (accepted.status_code, accepted.content) == (200, b"stored 1 of 1\n")
    assert (again.status_code, again.content) == (200, b"stored 0 of 1\n")
    assert oversized.status_code == 413
    assert stored(db_conn, "SELECT scope, recipient_key, reason FROM leasebox.suppressions") == [
        ("signup", "gone@example.org", "hard_bounce")
    ]


async def test_a_hard_bounce_suppresses_the_address_and_the_next_otp_ends_suppressed(
    now: dt.datetime,
    receivers: Receivers,
    signers: Signers,
    db_dsn: str,
    db_conn: psycopg.Connection[Any],
) -> None:
    cipher = PayloadCipher(allow_plaintext=True)

    def otp() -> int:
        message = OutboxMessage(kind="otp", recipient="Gone@Example.org", secrets={"code": "1"})
        receipt = enqueue(db_conn, message, scope="login", cipher=cipher)
        db_conn.commit()
        return receipt.outbox_id

    provider = ScriptedProvider()
    provider.message_id_prefix = "re"
    settings = replace(SETTINGS, drain=True)

    async def drain() -> Worker:
        async with AsyncConnectionPool(db_dsn, kwargs={"autocommit": True}) as pool:
            worker = Worker(settings, pool, provider, TemplateRenderer(), cipher=cipher)
            async with asyncio.timeout(20):
                await worker.run()
        return worker

    first = otp()
    await drain()
    [email] = provider.sent
    bounce = ResendSigner.event(
        "email.bounced",
        f"re-{email.delivery_key}",
        "gone@example.org",
        now,
        bounce={"type": "Permanent", "subType": "General", "message": "550 5.1.1 no such user"},
    )
    async with serve(FeedbackApp(receivers, dsn=db_dsn)) as base, aiohttp.ClientSession() as s:
        headers, body = signers.resend.request(bounce, now)
        async with s.post(f"{base}/resend", data=body, headers=headers) as answer:
            assert answer.status == 200
    second = otp()
    worker = await drain()

    assert [e.outbox_id for e in provider.sent] == [first]
    statuses = stored(
        db_conn, "SELECT id, status FROM leasebox.messages WHERE id = ANY(%s)", [first, second]
    )
    assert sorted(statuses) == [(first, "sent"), (second, "suppressed")]
    labels = {"kind": "otp", "source": "suppression_list"}
    assert worker.metrics.value("leasebox_suppressed_total", labels) == 1
