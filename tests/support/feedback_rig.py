"""What the receivers' tests share: the signers, the app on loopback, a sent message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import psycopg
import uvicorn

from leasebox.feedback.asgi import FeedbackApp
from leasebox.testing.ports import free_port
from support.mail_webhooks import (
    MailgunSigner,
    PostmarkCredentials,
    ResendSigner,
    SendGridSigner,
    SnsSigner,
)


@dataclass
class Signers:
    sns: SnsSigner
    sendgrid: SendGridSigner
    postmark: PostmarkCredentials
    mailgun: MailgunSigner
    resend: ResendSigner


@dataclass
class Answer:
    status: int
    text: str
    headers: dict[str, str]


@dataclass
class Hooks:
    """The receivers' app on loopback, and how a service posts to it."""

    base: str
    session: aiohttp.ClientSession
    app: FeedbackApp

    async def post(self, service: str, request: tuple[dict[str, str], bytes]) -> Answer:
        headers, body = request
        async with self.session.post(f"{self.base}/{service}", data=body, headers=headers) as r:
            return Answer(r.status, (await r.text()).strip(), dict(r.headers))

    def value(self, name: str, labels: dict[str, str]) -> float:
        return self.app.metrics.registry.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run `app` in uvicorn on a free loopback port for the block; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve())
    async with asyncio.timeout(30):
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(30):
            await serving


@dataclass(frozen=True)
class SentMessage:
    id: int
    provider_message_id: str
    recipient: str
    scope: str


def stored(conn: psycopg.Connection[Any], query: str, *args: Any) -> list[tuple[Any, ...]]:
    rows = conn.execute(query, args).fetchall()
    conn.rollback()
    return rows
