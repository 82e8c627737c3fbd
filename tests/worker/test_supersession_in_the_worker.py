"""The worker's own check for a newer message of a claimed one's replacement key.

Before it hands a message to the provider, the worker asks the database whether a newer
message of its key was committed since the claim; a provider that never checks (a plug-in,
a mail API without waits) is covered by that. The scripted provider here checks nothing, so
whatever it is not asked to send, the worker stopped.
"""

from __future__ import annotations

from dataclasses import replace

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox import OutboxMessage, enqueue
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.worker import database_clock
from support.running_worker import SETTINGS, make_worker, running
from support.waiting import wait_for_async
from support.worker_doubles import ScriptedProvider, row_of

KEY = "challenge-9"


def resend(conn: psycopg.Connection, recipient: str, key: str | None = KEY) -> int:
    receipt = enqueue(
        conn,
        OutboxMessage(kind="otp", recipient=recipient, secrets={"code": "1"}, replacement_key=key),
        cipher=PayloadCipher(allow_plaintext=True),
    )
    conn.commit()
    return receipt.outbox_id


async def test_a_claimed_code_replaced_before_its_send_is_settled_superseded_unsent(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    db_conn: psycopg.Connection,
) -> None:
    # One sender: the old code, claimed beside a message the provider holds, waits its turn.
    release = fake_provider.hold("busy@example.com")
    busy = resend(db_conn, "busy@example.com", None)
    old = resend(db_conn, "old@example.com")
    settings = replace(SETTINGS, concurrency=1, batch_size=2)
    worker = make_worker(db_pool, fake_provider, database_clock, settings)
    async with running(worker):
        await wait_for_async(
            lambda: fake_provider.held["busy@example.com"].is_set(),
            what='fake_provider.held["busy@example.com"].is_set()',
        )
        await wait_for_async(
            lambda: row_of(db_conn, old)["status"] == "processing",
            what='row_of(db_conn, old)["status"] == "processing"',
        )
        new = resend(db_conn, "new@example.com")
        release.set()
        await wait_for_async(
            lambda: row_of(db_conn, new)["status"] == "sent",
            what='row_of(db_conn, new)["status"] == "sent"',
        )
        await wait_for_async(
            lambda: row_of(db_conn, old)["status"] != "processing",
            what='row_of(db_conn, old)["status"] != "processing"',
        )

    assert (row_of(db_conn, old)["status"], row_of(db_conn, old)["superseded_by"]) == (
        "superseded",
        new,
    )
    assert row_of(db_conn, busy)["status"] == "sent"
    assert [e.recipient for e in fake_provider.sent] == ["busy@example.com", "new@example.com"]
    assert fake_provider.attempts["old@example.com"] == 0
    assert worker.metrics.value("leasebox_superseded_total", {"kind": "otp"}) == 1
    assert worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == 2
