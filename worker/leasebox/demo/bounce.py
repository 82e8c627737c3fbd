"""The demo's bounce: a mistyped address is accepted, bounces later, and is not mailed again.

A real mail service accepts a message to a mailbox that does not exist and reports the bounce
minutes later, by webhook. The demo's SMTP server accepts everything but one address, so the
demo plays the service's other half: once the message to `BOUNCING_ADDRESS` is sent, it posts
a hard bounce for it the way Resend does (an `email.bounced` event, signed with a Svix
secret made for the run) to the feedback receiver (`leasebox.feedback.asgi.FeedbackApp`,
served by uvicorn on loopback), which stores it and suppresses the mailbox in the message's
scope. The next login to that address is accepted by the API like any other, and the worker
that claims it ends it `suppressed`: the SMTP server never sees it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import psycopg
import uvicorn

from leasebox.db.queries import query
from leasebox.demo.evidence import DEMO_SQL
from leasebox.demo.scenario import BOUNCING_ADDRESS
from leasebox.feedback.asgi import FeedbackApp
from leasebox.feedback.receiver import Receivers
from leasebox.feedback.resend import ResendSettings
from leasebox.testing.ports import free_port


@dataclass(frozen=True)
class BounceReport:
    """What happened to the bounce: the receiver's answer, and when."""

    at_seconds: float
    status: int
    answer: str


class BouncingService:
    """The mail service's side of the bounce, and the receiver it reports to."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        receivers = Receivers(resend=ResendSettings((self.secret,)))
        self.app = FeedbackApp(receivers, dsn=dsn, schema=schema)
        self.schema = schema
        self.url = ""

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """Serve the receiver on loopback for the block; yields its base URL."""
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning")
        )
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.02)
            self.url = f"http://127.0.0.1:{port}"
            yield self.url
        finally:
            server.should_exit = True
            await task
            await self.app.close()

    def signed(self, event: dict[str, Any]) -> tuple[dict[str, str], bytes]:
        """The request as Resend sends it: Svix id, timestamp and signature headers."""
        body = json.dumps(event).encode()
        message_id = f"msg_{secrets.token_hex(12)}"
        timestamp = str(int(time.time()))
        key = base64.b64decode(self.secret.removeprefix("whsec_"))
        content = f"{message_id}.{timestamp}.".encode() + body
        signature = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
        headers = {
            "svix-id": message_id,
            "svix-timestamp": timestamp,
            "svix-signature": f"v1,{signature}",
            "content-type": "application/json",
        }
        return headers, body

    async def bounce(
        self,
        conn: psycopg.AsyncConnection[Any],
        session: aiohttp.ClientSession,
        at_seconds: float,
        wait_seconds: float = 10.0,
    ) -> BounceReport | None:
        """Report the hard bounce of the message sent to `BOUNCING_ADDRESS` (waiting for it
        to be sent, at most `wait_seconds`); None when it never was."""
        deadline = time.monotonic() + wait_seconds
        provider_id = None
        while provider_id is None and time.monotonic() < deadline:
            cur = await conn.execute(
                query("sent_to", self.schema, DEMO_SQL), {"recipient": BOUNCING_ADDRESS}
            )
            row = await cur.fetchone()
            provider_id = row[0] if row else None
            if provider_id is None:
                await asyncio.sleep(0.2)
        if provider_id is None:
            return None
        event = {
            "type": "email.bounced",
            "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "data": {
                "email_id": provider_id,
                "from": "no-reply@leasebox.demo",
                "to": [BOUNCING_ADDRESS],
                "bounce": {
                    "type": "Permanent",
                    "subType": "General",
                    "message": "550 5.1.1 The email account that you tried to reach does not exist",
                },
            },
        }
        headers, body = self.signed(event)
        async with session.post(f"{self.url}/resend", data=body, headers=headers) as answer:
            return BounceReport(at_seconds, answer.status, (await answer.text()).strip())
