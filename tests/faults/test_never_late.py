"""No OTP is written to the wire after its `expires_at`, however long it waited for a
connection; a send that started before the expiry may finish.

The SMTP server takes one message at a time (the provider's pool holds one connection), so
the others queue for it. The first test moves the worker's clock past the expiry while they
queue, deterministically; the second is the reported case in real time: a slow server, and
OTPs whose time runs out while they wait.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.providers import Email, provider_from_url
from leasebox.errors import MessageExpired, MessageSuperseded
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.worker import Worker
from support import hostile_http as http
from support import hostile_smtp as smtp
from support.fault_rig import SETTINGS, judge, rows, run_until_final, seed
from support.worker_doubles import ManualClock

pytestmark = pytest.mark.slow


def database_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    conn.rollback()
    assert row is not None
    value: datetime = row[0]
    return value


async def test_otps_that_expire_while_waiting_for_the_connection_never_reach_the_server(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.HOLD)
    expiry = datetime.now(UTC) + timedelta(minutes=5)
    seeded = seed(db_conn, cipher, 4, expires_at=expiry)
    clock = ManualClock(database_now(db_conn))
    moved = False

    async def expire_while_they_wait(worker: Worker) -> None:
        nonlocal moved
        # One message is on the wire (held by the server), three wait for the connection.
        if moved or not script.holding.is_set():
            return
        if worker.metrics.value("leasebox_inflight_sends") < 4:
            return
        clock.now = expiry + timedelta(seconds=1)
        moved = True
        script.release.set()

    with smtp.hostile_smtp(script) as server:
        provider = provider_from_url(server.url("pool_size=1"), timeout=30.0)
        run = await run_until_final(
            db_pool, provider, cipher, db_conn, while_running=expire_while_they_wait, clock=clock
        )
        judge(
            "smtp: OTPs expire while queued for the connection", db_conn, seeded, server.copies, run
        )
    found = rows(db_conn).values()
    assert sorted((r["status"], r["dead_reason"]) for r in found) == [
        ("dead", "expired"),
        ("dead", "expired"),
        ("dead", "expired"),
        ("sent", None),  # its send started before the expiry, so it may finish
    ]
    assert server.taken_count() == 1
    expired = run.worker.metrics.value(
        "leasebox_dead_letters_total", {"kind": "otp", "reason": "expired"}
    )
    assert expired == 3


async def test_with_a_slow_server_and_one_connection_nothing_is_written_after_its_expiry(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    # 1.5 s per message, one connection, a 2.5 s TTL: the second message still goes out in
    # time; the third and fourth would be written 3 s and 4.5 s in, after their expiry.
    script = smtp.Script(reply=lambda key, nth: smtp.SLOW, slow_seconds=1.5)
    expiry = datetime.now(UTC) + timedelta(seconds=2.5)
    seeded = seed(db_conn, cipher, 4, expires_at=expiry)
    with smtp.hostile_smtp(script) as server:
        provider = provider_from_url(server.url("pool_size=1"), timeout=10.0)
        run = await run_until_final(
            db_pool, provider, cipher, db_conn, settings=replace(SETTINGS, concurrency=4)
        )
        judge("smtp: slow server, pool of 1, 2.5 s TTL", db_conn, seeded, server.copies, run)
    found = rows(db_conn)
    written = [c for key in seeded.keys for c in server.taken(key)]
    # Written means DATA arrived; the check is made right before DATA is sent.
    assert all(c.data_at <= expiry.timestamp() + 0.5 for c in written), [
        c.data_at - expiry.timestamp() for c in written
    ]
    for key in seeded.keys:
        row = found[key]
        if server.taken(key):
            assert row["status"] == "sent"
        else:
            assert (row["status"], row["dead_reason"]) == ("dead", "expired")
    assert 1 <= len(written) < 4


async def _newer_committed() -> bool:
    return True


@pytest.mark.parametrize(
    ("stale", "refusal"),
    [
        ({"expired": lambda: True}, MessageExpired),
        ({"superseded": _newer_committed}, MessageSuperseded),
    ],
    ids=["expired", "superseded"],
)
async def test_an_expired_or_replaced_message_never_becomes_an_http_request(
    stale: dict[str, Any], refusal: type[Exception]
) -> None:
    with http.hostile_http() as server:
        provider = provider_from_url(server.url(), timeout=5.0)
        await provider.start()
        try:
            email = Email(
                outbox_id=1,
                kind="otp",
                aggregate_id=None,
                delivery_key="otp:stale",
                recipient="ada@example.com",
                subject="s",
                text="t",
                html=None,
                attempt=1,
                **stale,
            )
            with pytest.raises(refusal):
                await provider.send(email)
            await asyncio.sleep(0)
        finally:
            await provider.close()
    assert server.seen == {}
