"""A real SMTP server on loopback that records what it accepts, for the demo and the tests.

A delivery guarantee is only demonstrated by a receiver that counts: this sink speaks SMTP
(aiosmtpd), records every accepted message by its Message-ID and delivery key, and can play
the provider's bad days on cue: a window of transient `451` replies, addresses it rejects
permanently with `550`, and a per-message delay so that sends are in flight long enough for
a worker to die in the middle of one.

A message is recorded *before* the reply is delayed, the way a provider commits a message and
then answers: a worker killed while it waits for the `250` has still had its message
accepted, which is exactly the case that makes an at-least-once outbox send a duplicate.
"""

from __future__ import annotations

import asyncio
import email
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.message import EmailMessage
from email.policy import default as default_policy
from types import TracebackType
from typing import Any

from aiosmtpd.controller import Controller

from leasebox.testing.ports import free_port

TRANSIENT_REPLY = "451 4.3.0 Temporary failure, try again later"
REJECT_REPLY = "550 5.1.1 Mailbox unavailable"


@dataclass(frozen=True)
class ReceivedMessage:
    """One accepted copy of a message: what a mailbox would have shown."""

    message_id: str
    delivery_key: str | None
    recipient: str
    received_at: float
    text: str | None = None  # only with keep_bodies; never logged


class _Handler:
    """aiosmtpd handler hooks; they run on the sink's own thread and event loop."""

    def __init__(self, sink: SmtpSink) -> None:
        self._sink = sink

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]
    ) -> str:
        if address.lower() in self._sink.rejected:
            self._sink._count("permanent")
            return REJECT_REPLY
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self._sink.failing:
            self._sink._count("transient")
            return TRANSIENT_REPLY
        content = envelope.original_content or envelope.content
        raw = content if isinstance(content, bytes) else str(content).encode()
        self._sink._record(raw, list(envelope.rcpt_tos))
        if self._sink.delay_seconds > 0:
            await asyncio.sleep(self._sink.delay_seconds)
        return "250 2.0.0 Message accepted"


class SmtpSink:
    """A loopback SMTP server; `start()` it, point a worker at `url`, read `received`.

    `failing` switches the transient-failure window on and off (thread-safe: a bool);
    `rejected` holds lower-case addresses answered with 550 at RCPT.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        delay_seconds: float = 0.0,
        rejected: Iterable[str] = (),
        keep_bodies: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.host = host
        self.port = port or free_port()
        self.delay_seconds = delay_seconds
        self.rejected = frozenset(a.lower() for a in rejected)
        self.keep_bodies = keep_bodies
        self.failing = False
        self._clock = clock
        self._lock = threading.Lock()
        self._received: list[ReceivedMessage] = []
        self._rejections = {"transient": 0, "permanent": 0}
        self._controller = Controller(_Handler(self), hostname=host, port=self.port)
        self._running = False

    @property
    def url(self) -> str:
        """The provider URL a worker uses to send here (plain SMTP, no STARTTLS)."""
        return f"smtp://{self.host}:{self.port}?starttls=false"

    def start(self) -> SmtpSink:
        self._controller.start()
        self._running = True
        return self

    def stop(self) -> None:
        if self._running:
            self._running = False
            self._controller.stop()

    def __enter__(self) -> SmtpSink:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def received(self) -> list[ReceivedMessage]:
        """Every accepted copy so far, in arrival order (a snapshot)."""
        with self._lock:
            return list(self._received)

    @property
    def transient_rejections(self) -> int:
        with self._lock:
            return self._rejections["transient"]

    @property
    def permanent_rejections(self) -> int:
        with self._lock:
            return self._rejections["permanent"]

    def copies_by_delivery_key(self) -> dict[str, list[ReceivedMessage]]:
        """Accepted copies grouped by delivery key; more than one is a duplicate."""
        grouped: dict[str, list[ReceivedMessage]] = {}
        for message in self.received:
            grouped.setdefault(message.delivery_key or message.message_id, []).append(message)
        return grouped

    def _count(self, kind: str) -> None:
        with self._lock:
            self._rejections[kind] += 1

    def _record(self, raw: bytes, recipients: list[str]) -> None:
        parsed = email.message_from_bytes(raw, policy=default_policy)
        text = None
        if self.keep_bodies and isinstance(parsed, EmailMessage):
            body = parsed.get_body(("plain",))
            text = str(body.get_content()) if body is not None else None
        key = parsed.get("X-Leasebox-Delivery-Key")
        copy = ReceivedMessage(
            message_id=str(parsed.get("Message-ID", "")).strip(),
            delivery_key=str(key).strip() if key is not None else None,
            recipient=recipients[0] if recipients else "",
            received_at=self._clock(),
            text=text,
        )
        with self._lock:
            self._received.append(copy)
