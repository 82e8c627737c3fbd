"""A worker started without `LEASEBOX_PAYLOAD_KEYS` while encrypted OTPs wait.

A configuration fault is not a message's fault. Such a worker used to report ready and
dead-letter every encrypted message as `payload_keys` once its attempts were spent: the whole
OTP queue, for a missing Secret. Now the first message it cannot open makes it not ready (on
`/readyz` and in `leasebox_not_ready{cause="payload_keys"}`), it gives that message back with
its attempt, and it claims nothing more; a worker with the keys sends every message, each
with the one attempt that sent it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.rendering import TemplateRenderer
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.worker import Worker
from support.fault_rig import SETTINGS, judge, rows, run_until_final, seed
from support.history import events, histories
from support.worker_doubles import ScriptedProvider

pytestmark = pytest.mark.slow
MESSAGES = 6


def attempts_spent(conn: psycopg.Connection[Any]) -> int:
    return sum(int(r["attempts"]) for r in rows(conn).values())


async def test_a_worker_without_the_keys_is_not_ready_spends_no_attempt_and_claims_no_more(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    seeded = seed(db_conn, cipher, MESSAGES)
    keyless = Worker(
        replace(SETTINGS, concurrency=2, batch_size=2),
        db_pool,
        ScriptedProvider(),
        TemplateRenderer(),
        cipher=PayloadCipher(),  # LEASEBOX_PAYLOAD_KEYS unset
    )
    task = asyncio.get_running_loop().create_task(keyless.run())
    try:
        async with asyncio.timeout(30):
            # Until what it claimed is back in the queue, and it says why it is not ready or
            # (as before) it spent attempts on a fault of its own: the rows' statuses and
            # attempts come from one read, made after the readiness.
            while True:
                said = await keyless.readiness_problem()
                found = rows(db_conn).values()
                spent = sum(int(r["attempts"]) for r in found)
                if {r["status"] for r in found} == {"pending"} and (said or spent):
                    break
                assert not task.done(), "the worker stopped on its own"
                await asyncio.sleep(0.02)
        problem = await keyless.readiness_problem()
        assert not task.done(), "the worker must stay up, not ready, rather than exit"
    finally:
        keyless.request_stop()
        async with asyncio.timeout(30):
            await task
    assert problem is not None
    assert "LEASEBOX_PAYLOAD_KEYS" in problem
    assert keyless.metrics.value("leasebox_not_ready", {"cause": "payload_keys"}) == 1.0
    # Judged once it has stopped: a claim still on its way when it found out comes back too.
    assert attempts_spent(db_conn) == 0, "a configuration fault spent the messages' attempts"
    assert {r["status"] for r in rows(db_conn).values()} == {"pending"}
    # What it held when it found out (its senders and one batch more), and nothing after.
    assert keyless.metrics.value("leasebox_claimed_total", {"kind": "otp"}) <= 4

    keyed = ScriptedProvider()
    run = await run_until_final(db_pool, keyed, cipher, db_conn)
    taken: dict[str, list[Any]] = {}
    for email in keyed.sent:
        taken.setdefault(email.delivery_key, []).append(email)
    judge("no payload keys, then a worker with them", db_conn, seeded, taken, run)
    for history in histories(db_conn).values():
        assert events(history)[-2:] == ["claimed", "sent"]
    assert {r["attempts"] for r in rows(db_conn).values()} == {1}
