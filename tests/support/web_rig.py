"""`leasebox web` as the browser tests see it: a real server on loopback over a real outbox.

`seeded_outbox` fills a database the way production would: messages enqueued with a secret
code, then sent by a real `leasebox worker --drain` process through an SMTP sink that rejects
one mailbox (550) and, for a while, everything (451). What is left is realistic: sent
messages with their history, dead letters of two kinds with their provider errors, one
whose template lacks a variable, retries waiting out their backoff, and one pending
message created long ago (an SLA breach).
`running_web` serves the application from a thread of the test process, on a free port.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from aiohttp import web

from leasebox import OutboxMessage, enqueue
from leasebox.catalogue import Catalogue
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.testing.ports import free_port
from leasebox.testing.smtp_sink import SmtpSink
from leasebox.web.app import build_app
from leasebox.web.serving import connection_pool
from leasebox.web.settings import WebSettings
from support.outbox_rows import insert_message

CODE = "493817"
BOUNCING = "bounce@example.com"
RECIPIENT = "ada.lovelace@example.com"
LEASEBOX = Path(sys.executable).with_name("leasebox")
# A producer whose declaration of `verification` needs no variable: enqueue lets the message
# without a link through, and the worker, whose template does need it, dead-letters it.
_UNDECLARED_LINK = Catalogue()
_UNDECLARED_LINK.register_template("verification")


@dataclass(frozen=True)
class Seeded:
    """What the seeding left, by outbox id."""

    sent: tuple[int, ...]
    rejected: tuple[int, ...]
    invalid: int
    retrying: tuple[int, ...]
    stale: int


def _message(kind: str, recipient: str, n: int, *, link: bool = True) -> OutboxMessage:
    data: dict[str, object] = {"minutes_valid": 10, "name": f"Person {n}"}
    if link:
        data["link"] = f"https://app.example.com/verify/{n}"
    return OutboxMessage(
        kind=kind, recipient=recipient, aggregate_id=f"user-{n}", data=data, secrets={"code": CODE}
    )


def _drain(dsn: str, provider: str, *extra: str) -> None:
    env = {**os.environ, "LEASEBOX_ALLOW_PLAINTEXT_SECRETS": "1"}
    subprocess.run(
        [
            str(LEASEBOX),
            "worker",
            "--dsn",
            dsn,
            "--provider",
            provider,
            "--kinds",
            "otp,verification",
            "--drain",
            "--no-listen",
            "--metrics-port",
            "0",
            "--max-attempts",
            "3",
            "--log-format",
            "json",
            *extra,
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )


def seeded_outbox(dsn: str) -> Seeded:
    """Fill the database at `dsn` with sends, dead letters, retries and a stale message."""
    cipher = PayloadCipher(allow_plaintext=True)
    with SmtpSink(rejected=[BOUNCING]) as sink, psycopg.connect(dsn) as conn:
        sent = [
            enqueue(conn, _message("otp", RECIPIENT, n), cipher=cipher).outbox_id for n in range(6)
        ]
        rejected = [
            enqueue(conn, _message(kind, BOUNCING, n), cipher=cipher).outbox_id
            for n, kind in enumerate(["otp", "otp", "verification"], start=10)
        ]
        invalid = enqueue(
            conn,
            _message("verification", RECIPIENT, 15, link=False),
            cipher=cipher,
            catalogue=_UNDECLARED_LINK,
        ).outbox_id
        conn.commit()
        _drain(dsn, sink.url)
        sink.failing = True
        retrying = [
            enqueue(conn, _message("verification", RECIPIENT, n), cipher=cipher).outbox_id
            for n in range(20, 22)
        ]
        conn.commit()
        _drain(dsn, sink.url, "--backoff-base", "600", "--backoff-max", "600")
        stale = insert_message(
            conn,
            kind="otp",
            recipient=RECIPIENT,
            template="otp",
            delivery_key="otp:stale",
            created_at=datetime.now(UTC) - timedelta(minutes=3),
            available_at=datetime.now(UTC) + timedelta(hours=1),
        )
        conn.commit()
    return Seeded(tuple(sent), tuple(rejected), invalid, tuple(retrying), stale)


@contextmanager
def running_web(settings: WebSettings) -> Iterator[str]:
    """Serve `settings` on a free loopback port from a thread; yields the base URL."""
    settings = replace(settings, port=free_port())
    ready = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        with connection_pool(settings) as pool:
            runner = web.AppRunner(build_app(settings, pool), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, settings.host, settings.port).start()
            ready.set()
            try:
                await stop.wait()
            finally:
                await runner.cleanup()

    def main() -> None:
        try:
            loop.run_until_complete(serve())
        except BaseException as exc:  # reported by the caller below
            failure.append(exc)
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="leasebox web", daemon=True)
    thread.start()
    if not ready.wait(30) or failure:
        raise RuntimeError(f"leasebox web did not start: {failure}")
    try:
        yield f"http://{settings.host}:{settings.port}"
    finally:
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(30)
