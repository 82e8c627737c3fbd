"""Fixtures for the receivers' tests: each service's signer, the receivers configured with
their keys, the app served by uvicorn on loopback, and a message the worker sent."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from leasebox.feedback.asgi import FeedbackApp
from leasebox.feedback.mailgun import MailgunSettings
from leasebox.feedback.postmark import PostmarkSettings
from leasebox.feedback.receiver import Receivers
from leasebox.feedback.resend import ResendSettings
from leasebox.feedback.sendgrid import SendGridSettings
from leasebox.feedback.sns import SesSettings
from support.feedback_rig import Hooks, SentMessage, Signers, serve
from support.mail_webhooks import (
    TOPIC,
    MailgunSigner,
    PostmarkCredentials,
    ResendSigner,
    SendGridSigner,
    SnsCertificateServer,
    SnsSigner,
    sns_certificate_server,
)
from support.outbox_rows import insert_message


@pytest.fixture
async def sns_server(tmp_path: Path) -> AsyncIterator[SnsCertificateServer]:
    async with sns_certificate_server(tmp_path) as server:
        yield server


@pytest.fixture
def signers(sns_server: SnsCertificateServer) -> Signers:
    return Signers(
        SnsSigner(sns_server), SendGridSigner(), PostmarkCredentials(), MailgunSigner(),
        ResendSigner(),
    )  # fmt: skip


@pytest.fixture
def receivers(signers: Signers, sns_server: SnsCertificateServer) -> Receivers:
    """Every service, each with a rotated-out secret beside the one the signer uses."""
    return Receivers(
        ses=SesSettings(frozenset({TOPIC}), certificates=sns_server.certificates()),
        sendgrid=SendGridSettings((SendGridSigner().public_key, signers.sendgrid.public_key)),
        postmark=PostmarkSettings((("old", "retired"), ("hooks", signers.postmark.password))),
        mailgun=MailgunSettings(("retired-key", signers.mailgun.key)),
        resend=ResendSettings((ResendSigner().secret, signers.resend.secret)),
        max_body_bytes=64 * 1024,
    )


@pytest.fixture
def make_hooks(receivers: Receivers, db_dsn: str) -> Callable[..., Any]:
    """Serve a `FeedbackApp` (receivers, schema and clock overridable) for a block."""

    @asynccontextmanager
    async def hooks(**overrides: Any) -> AsyncIterator[Hooks]:
        app = FeedbackApp(
            overrides.pop("receivers", receivers), dsn=db_dsn, serve_metrics=True, **overrides
        )
        async with aiohttp.ClientSession() as session, serve(app) as base:
            yield Hooks(base, session, app)

    return hooks


@pytest.fixture
async def hooks(make_hooks: Callable[..., Any]) -> AsyncIterator[Hooks]:
    async with make_hooks() as served:
        yield served


@pytest.fixture
def sent(db_conn: psycopg.Connection[Any]) -> Callable[..., SentMessage]:
    """Write a message the worker sent, with the provider's id for it."""

    def write(provider_message_id: str, recipient: str = "gone@example.org",
              scope: str = "login") -> SentMessage:  # fmt: skip
        outbox_id = insert_message(
            db_conn,
            status="sent",
            kind="otp",
            template="otp",
            recipient=recipient,
            recipient_key=recipient.lower(),
            scope=scope,
            delivery_key=f"otp:{provider_message_id}",
            provider_message_id=provider_message_id,
            sent_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
        )
        db_conn.commit()
        return SentMessage(outbox_id, provider_message_id, recipient, scope)

    return write


@pytest.fixture
def now() -> dt.datetime:
    """The time a test's requests are signed at (each test its own: a signature is stale
    five minutes later, and a full test run is longer than that)."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0)
