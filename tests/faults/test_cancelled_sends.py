"""A send cut short by a stop: given back when nothing went out, counted when it may have.

The grace period after SIGTERM ends by cancelling the sends still running. A send that was
still waiting (for a connection, before the provider's last check) wrote nothing, and its
row is released with its attempt given back. A send cancelled after the message went to the
provider is an ambiguous outcome, as a connection lost before the answer is: its attempt
counts, the history says `ambiguous`, and `leasebox trace` counts a copy the provider may
have. Before, such a row was released with its attempt given back at every stop, and an OTP
with `max_attempts=3` was accepted six times across six stops, still pending.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.cli.main import main
from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.providers.base import Email, SendResult
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.worker import Worker
from leasebox.store.history import HistoryEvent
from support import hostile_smtp as smtp
from support.fault_rig import SETTINGS, rows, seed
from support.history import events, histories

pytestmark = pytest.mark.slow
SETTINGS_3 = replace(SETTINGS, max_attempts=3, backoff_base=0.01, backoff_max=0.01)


async def test_a_send_cancelled_after_the_message_went_out_is_counted_and_ambiguous(
    db_dsn: str,
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seeded = seed(db_conn, cipher, 1)
    [key] = seeded.keys
    script = smtp.Script(reply=lambda key, nth: smtp.HOLD)
    with smtp.hostile_smtp(script) as server:
        for stop in range(1, SETTINGS_3.max_attempts + 1):
            provider = provider_from_url(server.url("pool_size=1"), timeout=30.0)
            await provider.start()
            worker = Worker(SETTINGS_3, db_pool, provider, TemplateRenderer(), cipher=cipher)
            await stop_while_sending_until(worker, lambda stop=stop: len(server.taken(key)) >= stop)
            await provider.close()
            row = rows(db_conn)[key]
            assert row["attempts"] == stop, "a stop gave back an attempt the provider may have"
        script.release.set()
    row = rows(db_conn)[key]
    assert (row["status"], row["dead_reason"]) == ("dead", "possibly_delivered")
    assert [c.attempt for c in server.taken(key)] == [1, 2, 3]
    told = histories(db_conn)[row["id"]]
    assert events(told) == ["claimed", "ambiguous", "claimed", "ambiguous", "claimed", "dead"]
    assert main(["trace", "--dsn", db_dsn, "--id", str(row["id"]), "--json"]) == 0
    [send] = json.loads(capsys.readouterr().out)["sends"]
    assert (send["copies"]["accepted"], send["copies"]["possible"]) == (0, 3)


async def stop_while_sending_until(worker: Worker, went_out: Any) -> None:
    """Run `worker`, and stop it twice once `went_out()` says the server holds the message."""
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with asyncio.timeout(30):
            while not went_out():
                assert not task.done(), "the worker stopped on its own"
                await asyncio.sleep(0.01)
    finally:
        worker.request_stop()
        worker.request_stop()
        async with asyncio.timeout(30):
            await task
    assert not worker.failed


class WaitingProvider:
    """A provider still waiting for a connection when it is cancelled: nothing went out."""

    name = "waiting"

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.never = asyncio.Event()

    async def start(self) -> None:
        return None

    async def send(self, email: Email) -> SendResult:
        self.waiting.set()
        await self.never.wait()  # a connection that never comes free
        email.raise_if_expired()
        raise AssertionError("the message must not be written")

    async def check(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


async def test_a_send_cancelled_before_the_message_went_out_is_released_unsent(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    seeded = seed(db_conn, cipher, 1)
    provider = WaitingProvider()
    worker = Worker(SETTINGS_3, db_pool, provider, TemplateRenderer(), cipher=cipher)
    await stop_while_sending_until(worker, provider.waiting.is_set)
    row = rows(db_conn)[seeded.keys[0]]
    assert (row["status"], row["attempts"]) == ("pending", 0)
    told: list[HistoryEvent] = histories(db_conn)[row["id"]]
    assert events(told) == ["claimed", "released"]
