"""The receivers as one ASGI app: `leasebox feedback serve`, or mounted in your own app.

    app = FeedbackApp(Receivers.from_env(), dsn=os.environ["LEASEBOX_DSN"])
    fastapi_app.mount("/hooks/mail", app)        # POST /hooks/mail/sendgrid, .../ses, ...

`POST .../<service>` (the last path segment: `ses`, `sendgrid`, `postmark`, `mailgun`,
`resend`) is judged by `receiver.accept` and its events stored in one transaction; `GET
.../healthz` answers 200; `GET .../metrics` serves the receivers' metrics when
`serve_metrics` is set (the command sets it; a mounting app exposes `app.metrics.registry`
its own way). The body is read up to the size limit and no further. A mounted app gets no
lifespan events from Starlette, so the connection pool opens on the first request; `close()`
(or the lifespan's shutdown) closes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox.db.queries import DEFAULT_SCHEMA
from leasebox.feedback.metrics import FeedbackMetrics
from leasebox.feedback.receiver import (
    STORAGE_FAILED,
    Receivers,
    Reply,
    accept,
    label,
    outcome,
    refusal,
)
from leasebox.feedback.recording import record_async
from leasebox.feedback.signing import Inbound, Refused

log = logging.getLogger("leasebox.feedback")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def utc_now() -> datetime:
    return datetime.now(UTC)


class FeedbackApp:
    """An ASGI application receiving the mail services' webhooks."""

    def __init__(
        self,
        receivers: Receivers,
        *,
        dsn: str | None = None,
        pool: AsyncConnectionPool | None = None,
        schema: str = DEFAULT_SCHEMA,
        metrics: FeedbackMetrics | None = None,
        serve_metrics: bool = False,
        clock: Callable[[], datetime] = utc_now,
        db_clock: Callable[[], datetime | None] = lambda: None,
    ) -> None:
        if pool is None and dsn is None:
            raise ValueError("FeedbackApp needs a dsn or a pool")
        self.receivers = receivers
        self.metrics = metrics or FeedbackMetrics()
        self._pool = pool
        self._owns_pool = pool is None
        self._dsn = dsn
        self._schema = schema
        self._serve_metrics = serve_metrics
        self._clock = clock
        self._db_clock = db_clock
        self._opening = asyncio.Lock()

    async def _connections(self) -> AsyncConnectionPool:
        async with self._opening:
            if self._pool is None:
                pool = AsyncConnectionPool(self._dsn or "", min_size=1, max_size=8, open=False)
                await pool.open()
                self._pool = pool
            return self._pool

    async def close(self) -> None:
        """Close the pool this app opened (a pool given to it is the giver's)."""
        if self._owns_pool and self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        service = str(scope.get("path", "")).rstrip("/").rsplit("/", 1)[-1]
        method = scope.get("method", "GET")
        if method == "GET" and service == "healthz":
            await _answer(send, Reply(200, "ok"))
        elif method == "GET" and service == "metrics" and self._serve_metrics:
            await _answer(send, Reply(200, self.metrics.exposition().decode()), "text/plain")
        elif method != "POST":
            await _answer(send, Reply(405, "method_not_allowed", (("allow", "POST"),)))
        else:
            await _answer(send, await self._receive(service, scope, receive))

    async def _receive(self, service: str, scope: Scope, receive: Receive) -> Reply:
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", [])
        }
        body = await _body(receive, headers, self.receivers.max_body_bytes)
        try:
            if body is None:
                raise Refused(413, "too_large")
            inbound = Inbound(headers, body, self._clock())
            if service == "ses":  # may fetch a certificate: not on the event loop
                accepted = await asyncio.to_thread(accept, self.receivers, service, inbound)
            else:
                accepted = accept(self.receivers, service, inbound)
        except Refused as refused:
            self.metrics.request(label(service), refused.reason)
            log.info("refused a %s webhook: %s", label(service), refused.reason)
            return refusal(service, refused)
        if not accepted.events and accepted.token is None:
            self.metrics.request(service, accepted.note)
            return Reply(200, accepted.note)
        try:
            pool = await self._connections()
            async with pool.connection() as conn:
                recorded = await record_async(
                    conn,
                    service,
                    accepted.events,
                    token=accepted.token,
                    rules=self.receivers.rules,
                    schema=self._schema,
                    now=self._db_clock(),
                )
        except (psycopg.Error, OSError, TimeoutError) as exc:
            self.metrics.request(service, "storage_error")
            log.warning(
                "could not store a %s webhook's events (%s); the service will retry",
                service,
                type(exc).__name__,
            )
            return STORAGE_FAILED
        self.metrics.recorded(service, recorded)
        return outcome(recorded)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _body(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    """The request's body, or None as soon as it is longer than `limit` (read no further)."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Send, reply: Reply, content_type: str = "text/plain") -> None:
    body = (reply.text + "\n").encode()
    headers = [
        (b"content-type", f"{content_type}; charset=utf-8".encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in reply.headers),
    ]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
