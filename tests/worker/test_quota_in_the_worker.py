"""A worker under its provider account's quota: a 429 pauses every worker of the account, an
OTP whose token would come after its expiry is not kept waiting, and a worker claims no more
than it can send soon.

Workers run in the test's event loop against a real PostgreSQL; the provider is a loopback
HTTP mail API (aiohttp) that stamps each request on its own clock and answers one of them
429 with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from aiohttp import web
from psycopg_pool import AsyncConnectionPool

from leasebox import OutboxMessage, enqueue_many
from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime import upkeep
from leasebox.runtime.quota import QuotaGate
from leasebox.runtime.worker import Worker, database_clock
from leasebox.store import quotas
from leasebox.testing.ports import free_port
from support.running_worker import SETTINGS, make_worker, running
from support.waiting import wait_for_async
from support.worker_doubles import ScriptedProvider, statuses

ACCOUNT = "acct-under-test"
# Requests that may arrive after a 429, sent on tokens granted before it: a quarter of what the
# quota (40/s) grants in the second the 429's reset lasts.
IN_FLIGHT_AT_THE_429 = 10


@dataclass
class MailApi:
    """POST /send: 202 with an id, except the `throttle_at`-th request (429, Retry-After)."""

    throttle_at: int = 0
    retry_after: int = 1
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    throttled_at: float | None = None
    port: int = field(default_factory=free_port)

    async def send(self, request: web.Request) -> web.Response:
        await request.read()
        self.arrivals.append((time.monotonic(), len(self.arrivals) + 1))
        if len(self.arrivals) == self.throttle_at:
            self.throttled_at = time.monotonic()
            return web.Response(status=429, headers={"Retry-After": str(self.retry_after)})
        return web.json_response({"id": f"m-{len(self.arrivals)}"}, status=202)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/send"


@pytest.fixture
async def mail_api() -> AsyncIterator[MailApi]:
    api = MailApi()
    app = web.Application()
    app.router.add_post("/send", api.send)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", api.port).start()
    try:
        yield api
    finally:
        await runner.cleanup()


def seed(conn: psycopg.Connection[Any], count: int, **fields: Any) -> None:
    enqueue_many(
        conn,
        [
            OutboxMessage(
                kind="otp",
                recipient=f"u{i}-{uuid.uuid4().hex[:6]}@example.com",
                secrets={"code": "123456"},
                **fields,
            )
            for i in range(count)
        ],
        cipher=PayloadCipher(allow_plaintext=True),
    )
    conn.commit()


def quota_settings(rate: float, worker_id: str, **overrides: Any) -> Any:
    return replace(
        SETTINGS,
        kinds=("otp",),
        quota_rate=rate,
        quota_burst=1,
        quota_account=ACCOUNT,
        worker_id=worker_id,
        **overrides,
    )


async def test_a_429_pauses_every_worker_of_the_account_until_its_reset(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    db_dsn: str,
    mail_api: MailApi,
) -> None:
    mail_api.throttle_at = 6
    seed(db_conn, 30)
    providers = [provider_from_url(mail_api.url, timeout=5.0) for _ in range(2)]
    workers = [
        Worker(
            quota_settings(40.0, f"w{n}", listen=True, backoff_base=0.05, backoff_max=0.1),
            db_pool,
            provider,
            TemplateRenderer(),
            dsn=db_dsn,
            cipher=PayloadCipher(allow_plaintext=True),
        )
        for n, provider in enumerate(providers)
    ]
    try:
        async with running(workers[0]), running(workers[1]):
            await wait_for_async(
                lambda: statuses(db_conn) == {"sent": 30},
                what='statuses(db_conn) == {"sent": 30}',
                timeout=30,
            )
    finally:
        for provider in providers:
            await provider.close()

    assert mail_api.throttled_at is not None
    throttled = [n for n, _ in enumerate(mail_api.arrivals) if n + 1 == mail_api.throttle_at]
    assert throttled == [mail_api.throttle_at - 1], "the provider refused one request alone"
    # Requests whose token was granted before the pause was recorded may still arrive after
    # the 429, however late a loaded machine lets them. Without a shared pause the other
    # worker would go on at the quota's pace until the reset, about 40 requests: far more.
    paused = [
        at - mail_api.throttled_at
        for at, _ in mail_api.arrivals
        if 0 < at - mail_api.throttled_at < mail_api.retry_after - 0.05
    ]
    assert len(paused) <= IN_FLIGHT_AT_THE_429, paused
    assert len(mail_api.arrivals) == 31  # each message once, and the refused one again
    pauses = sum(worker.quota is not None and worker.quota.paused for worker in workers)
    assert pauses == 0  # over by now


async def test_an_otp_whose_token_would_come_after_its_expiry_is_dead_lettered_at_once(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    fake_provider: ScriptedProvider,
) -> None:
    # One token every 5 s from the first claim, and OTPs that expire 10 s after they are
    # written: the third to fifth tokens are due at or after the OTPs' expiry. The spacing
    # leaves a slow machine seconds, not tenths, between a token and an expiry.
    worker = make_worker(db_pool, fake_provider, database_clock, quota_settings(0.2, "w"))
    async with running(worker):
        now = db_conn.execute("SELECT now()").fetchone()
        db_conn.rollback()
        assert now is not None
        expires_at = now[0] + timedelta(seconds=10)
        seed(db_conn, 5, expires_at=expires_at)
        await wait_for_async(
            lambda: statuses(db_conn).get("pending", 0) == 0,
            what='statuses(db_conn).get("pending", 0) == 0',
            timeout=20,
        )
        await wait_for_async(
            lambda: "processing" not in statuses(db_conn),
            what='"processing" not in statuses(db_conn)',
            timeout=20,
        )

    found = db_conn.execute(
        "SELECT m.status, m.dead_reason, h.at, h.error FROM leasebox.messages AS m"
        " LEFT JOIN leasebox.history AS h ON h.outbox_id = m.id AND h.event = 'dead'"
    ).fetchall()
    db_conn.rollback()
    dead = [(at, error) for status, reason, at, error in found if reason == "expired"]
    sent = [status for status, _, _, _ in found if status == "sent"]
    assert len(dead) + len(sent) == 5
    # Those ended because their token would come too late ended then, not at their expiry. (A
    # machine too slow to reach an OTP before its expiry dead-letters it as expired too.)
    spared = [at for at, error in dead if error and "quota token" in error]
    assert spared, found
    assert all(at < expires_at for at in spared), "it waited for a token past its expiry"
    assert len(fake_provider.sent) == len(sent)


async def test_a_worker_under_a_quota_leaves_in_the_queue_what_it_cannot_send_soon(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    fake_provider: ScriptedProvider,
) -> None:
    seed(db_conn, 20)
    settings = quota_settings(2.0, "w", concurrency=8, batch_size=8)
    worker = make_worker(db_pool, fake_provider, database_clock, settings)
    held: list[int] = []
    async with running(worker):
        await wait_for_async(
            lambda: len(fake_provider.sent) >= 3, what="len(fake_provider.sent) >= 3", timeout=20
        )
        held.append(worker.held)
        held.append(statuses(db_conn).get("processing", 0))
    assert worker.quota is not None
    assert worker.quota.batch == 1
    # One reservation's worth waits for its token (and one may be with the provider); the
    # rest of the backlog stays pending, claimable by whoever comes first.
    assert max(held) <= 2, held


async def test_a_pause_reaches_the_other_workers_of_the_account_by_notify(
    db_pool: AsyncConnectionPool, db_dsn: str
) -> None:
    def gate(account: str) -> QuotaGate:
        return QuotaGate(
            db_pool, account=account, rate=10.0, burst=1, schema="leasebox", clock=database_clock
        )

    refused, other, elsewhere = gate(ACCOUNT), gate(ACCOUNT), gate("another-account")
    assert await refused.take()  # the account's row exists from the first reservation on
    # One wake per listener: each sets its own once connected, so the pause is sent only
    # when both listen (a listener not yet connected would miss it).
    wakes = {g: asyncio.Event() for g in (other, elsewhere)}
    listeners = [
        asyncio.create_task(upkeep.listen_for_rows(db_dsn, "leasebox", wake, g.notice))
        for g, wake in wakes.items()
    ]
    try:
        await wait_for_async(
            lambda: all(wake.is_set() for wake in wakes.values()), what="both listening"
        )
        refused.pause(30.0)
        await wait_for_async(lambda: other.paused, what="other.paused")
        assert not elsewhere.paused
        async with db_pool.connection() as conn:
            later = await quotas.reserve_tokens(conn, account=ACCOUNT, rate=10.0, burst=1, count=1)
        assert later.paused_until is not None
        assert later.first_at >= later.paused_until, "no token is due before the pause ends"
        assert later.paused_until - later.now > timedelta(seconds=25)
    finally:
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
        for g in (refused, other, elsewhere):
            await g.close()
