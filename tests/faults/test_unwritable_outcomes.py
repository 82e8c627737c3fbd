"""What a provider says can never stop the worker, and what the worker knows is never lost.

A reply the database cannot store used to make the batched `mark_sent` raise, which killed
the flusher and then the worker, dropped every outcome it had not written, and sent the
whole batch again on restart. Here: a plugin-style provider that returns and raises the
worst it can, a batch the database refuses (written around the bad outcome), and a database
that is away while the worker stops (the outcomes wait for it).
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.providers.base import Email, SendResult
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.delivery.retrying import failure_code
from leasebox.errors import TransientProviderError
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.completion import UNSTORABLE_ERROR, Completion, CompletionBatcher
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.runtime.worker import Worker
from leasebox.states import DeadReason
from leasebox.store import claiming
from leasebox.store.settling import Dead, Retry, Sent
from support.fault_rig import SETTINGS, judge, rows, run_until_final, seed
from support.worker_doubles import ScriptedProvider

pytestmark = pytest.mark.slow
WEIRD_CODE = "Weird Code!! \x00 with spaces and ünïcödé " * 20


class WorstProvider:
    """A provider as careless as a plugin can be: ids and errors full of what cannot be
    stored, codes that are no labels, a Retry-After that is not a number of seconds."""

    name = "worst"

    def __init__(self) -> None:
        self.sent: dict[str, list[int]] = {}
        self.failed_once: set[str] = set()

    async def start(self) -> None:
        return None

    async def send(self, email: Email) -> SendResult:
        n = email.outbox_id % 4
        if n == 0 and email.delivery_key not in self.failed_once:
            self.failed_once.add(email.delivery_key)
            error = TransientProviderError(
                WEIRD_CODE,
                "bad \x00 news \ud800 " + "x" * 1_000_000,
                retry_after=math.nan,
            )
            raise error
        self.sent.setdefault(email.delivery_key, []).append(email.attempt)
        if n == 1:
            return SendResult("abc\x00def")
        if n == 2:
            return SendResult("id-\udc80-" + "9" * 1_000_000, warning="also \x00 odd \ud800")
        return SendResult("fine-id")

    async def check(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


async def test_a_provider_returning_nul_bytes_surrogates_and_megabyte_ids_sends_each_once(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    provider = WorstProvider()
    seeded = seed(db_conn, cipher, 20)
    run = await run_until_final(db_pool, provider, cipher, db_conn)

    class Copy:
        def __init__(self, attempt: int) -> None:
            self.attempt = attempt

    taken = {key: [Copy(a) for a in attempts] for key, attempts in provider.sent.items()}
    judge("plugin: NUL, surrogates, 1 MB ids and errors", db_conn, seeded, taken, run)
    found = rows(db_conn)
    assert {r["status"] for r in found.values()} == {"sent"}
    assert all(len(provider.sent[key]) == 1 for key in seeded.keys)  # 20 sends for 20 messages
    ids = {r["provider_message_id"] for r in found.values()}
    assert ids <= {"abc\ufffddef", None, "fine-id"}
    label = failure_code(WEIRD_CODE)
    assert re.fullmatch(r"[a-z0-9_]{1,40}", label), label
    retried = run.worker.metrics.value(
        "leasebox_retries_total", {"kind": "otp", "error_class": label}
    )
    assert retried == 5


async def claimed(pool: AsyncConnectionPool, count: int) -> list[claiming.ClaimedMessage]:
    async with pool.connection() as conn:
        return await claiming.claim(
            conn, kinds=["otp"], limit=count, lease_seconds=60, worker_id="w"
        )


async def test_a_batch_the_database_refuses_is_written_around_the_outcome_it_cannot_store(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    # The boundary cleans what providers say; this is the line of defence behind it.
    seed(db_conn, cipher, 6)
    messages = await claimed(db_pool, 6)
    settled: list[int] = []
    batcher = CompletionBatcher(
        db_pool, WorkerMetrics(), schema="leasebox", clock=lambda: None, on_settled=settled.append
    )
    bad_id, bad_error, fine = messages[0], messages[1], messages[2:]
    batcher.put(Completion(bad_id, Sent(bad_id.lease, "abc\x00def")))
    batcher.put(Completion(bad_error, Retry(bad_error.lease, 1.0, "bad \x00 text", "code\x00")))
    for message in fine[:2]:
        batcher.put(Completion(message, Sent(message.lease, "ok")))
    for message in fine[2:]:
        batcher.put(
            Completion(message, Dead(message.lease, DeadReason.REJECTED, "550", "smtp_550"))
        )
    flusher = asyncio.get_running_loop().create_task(batcher.run())
    async with asyncio.timeout(30):
        while len(settled) < 6:
            assert not flusher.done(), "the flusher stopped on an outcome it could not store"
            await asyncio.sleep(0.01)
    await batcher.close()
    await flusher
    found = {r["id"]: r for r in rows(db_conn).values()}
    assert (found[bad_id.id]["status"], found[bad_id.id]["provider_message_id"]) == ("sent", None)
    assert found[bad_error.id]["status"] == "pending"
    assert found[bad_error.id]["last_error"] == UNSTORABLE_ERROR
    assert [found[m.id]["status"] for m in fine] == ["sent", "sent", "dead", "dead"]


def _set_connections(server_dsn: str, dsn: str, allowed: bool) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                sql.Identifier(str(name)), sql.Literal(allowed)
            )
        )
        if not allowed:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (str(name),),
            )


async def test_an_outcome_known_at_shutdown_waits_for_the_database_and_is_never_dropped(
    db_dsn: str, server_dsn: str, cipher: PayloadCipher
) -> None:
    with psycopg.connect(db_dsn) as conn:
        [key] = seed(conn, cipher, 1).keys
    provider = ScriptedProvider()
    release = provider.hold("user0@example.com")
    async with AsyncConnectionPool(
        db_dsn, min_size=1, max_size=2, timeout=0.5, kwargs={"autocommit": True}
    ) as pool:
        worker = Worker(SETTINGS, pool, provider, TemplateRenderer(), cipher=cipher)
        task = asyncio.get_running_loop().create_task(worker.run())
        await provider.held["user0@example.com"].wait()
        _set_connections(server_dsn, db_dsn, allowed=False)
        try:
            worker.request_stop()
            release.set()  # the provider accepts: the worker now knows the message was sent
            # Past the point where an outcome used to be given up (5 s of failed writes).
            async with asyncio.timeout(60):
                while worker.completions.write_failures < 6:
                    assert not task.done(), "the worker exited with an outcome it had not written"
                    await asyncio.sleep(0.05)
        finally:
            _set_connections(server_dsn, db_dsn, allowed=True)
        async with asyncio.timeout(60):
            await task
    assert worker.completions.given_up == 0
    with psycopg.connect(db_dsn) as conn:
        row = rows(conn)[key]
    assert (row["status"], row["provider_message_id"]) == ("sent", f"scripted-{key}")
