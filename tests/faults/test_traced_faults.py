"""`leasebox trace` tells the story of the fault suite's in-process scenarios correctly.

Each scenario runs the real worker against the hostile SMTP server, as the rest of the
suite does, and then asks the trace (the product's reader and story, and the command once)
what happened: how many logical sends and requests, who owned the attempts, and how many
copies the provider accepted or may have. The answers must match what the server saw.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.cli.main import main
from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.providers.base import derived_message_id
from leasebox.inspection.narrative import chronicle, copies_answer, requests_answer
from leasebox.inspection.trace import Ownership, Trace, build_trace
from leasebox.messages import OutboxMessage
from leasebox.producer.enqueue import enqueue
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.store.history import Selector, read_trace
from support import hostile_smtp as smtp
from support.fault_rig import SETTINGS, judge, run_until_final, seed

pytestmark = pytest.mark.slow
WORKER = SETTINGS.worker_id


def traced(conn: psycopg.Connection[Any], **selector: Any) -> Trace:
    """What `leasebox trace` reads and tells for `selector`."""
    chosen = Selector(**selector)
    records = read_trace(conn, chosen)
    conn.rollback()
    return build_trace(records, chosen)


async def test_an_ambiguous_drop_is_told_as_one_owner_and_a_copy_that_may_have_arrived(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    db_dsn: str,
    cipher: PayloadCipher,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seeded = seed(db_conn, cipher, 3)
    script = smtp.Script(reply=lambda key, nth: smtp.DROP if nth == 1 else smtp.ACCEPT)
    with smtp.hostile_smtp(script) as server:
        provider = provider_from_url(server.url("pool_size=2"), timeout=2.0)
        run = await run_until_final(db_pool, provider, cipher, db_conn)
        judge("trace: smtp drop before 250", db_conn, seeded, server.copies, run, duplicates=True)
        taken = {key: len(server.taken(key)) for key in seeded.keys}
    for key in seeded.keys:
        (send,) = traced(db_conn, delivery_key=key).sends
        assert [a.outcome for a in send.attempts] == ["ambiguous", "sent"]
        assert send.attempts[0].error_class == "ambiguous"
        assert send.ownership == Ownership.ONE_WORKER
        assert send.workers == (WORKER,)
        assert (send.copies.accepted, send.copies.possible) == (1, 1)
        assert taken[key] == send.copies.accepted + send.copies.possible
        assert f"{WORKER}'s send ended ambiguously (ambiguous: the provider may have taken it)" in (
            chronicle(send)
        )
        assert f"(Message-ID {derived_message_id(key)})" in copies_answer(send)
    code = main(["trace", "--dsn", db_dsn, "--delivery-key", seeded.keys[0], "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["sends"][0]["ownership"]["verdict"] == "one_worker"
    assert [e["event"] for e in data["sends"][0]["timeline"]] == [
        "claimed",
        "ambiguous",
        "claimed",
        "sent",
    ]
    assert seeded.codes[seeded.keys[0]] not in json.dumps(data)


async def test_a_transient_refusal_then_a_send_is_one_owner_and_one_copy(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    seeded = seed(db_conn, cipher, 2)
    script = smtp.Script(reply=lambda key, nth: smtp.DEFER if nth == 1 else smtp.ACCEPT)
    with smtp.hostile_smtp(script) as server:
        provider = provider_from_url(server.url("pool_size=2"), timeout=2.0)
        run = await run_until_final(db_pool, provider, cipher, db_conn)
        judge("trace: smtp 451 once", db_conn, seeded, server.copies, run)
    for key in seeded.keys:
        (send,) = traced(db_conn, delivery_key=key).sends
        assert [a.outcome for a in send.attempts] == ["retry", "sent"]
        assert send.attempts[0].error_class == "smtp_451"
        assert send.attempts[0].retry_delay_seconds is not None
        assert (send.copies.accepted, send.copies.possible) == (1, 0)
        assert copies_answer(send) == "the provider accepted 1 copy"


async def test_retried_requests_that_reuse_a_receipt_are_one_logical_send(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    message = OutboxMessage(
        kind="otp",
        recipient="ada@example.com",
        aggregate_id="user-7",
        data={"minutes_valid": 5},
        secrets={"code": "493817"},
    )
    receipts = [
        enqueue(db_conn, message, idempotency_key="login-7", cipher=cipher) for _ in range(3)
    ]
    db_conn.commit()
    assert [r.reused for r in receipts] == [False, True, True]
    with smtp.hostile_smtp(smtp.Script()) as server:
        provider = provider_from_url(server.url("pool_size=2"), timeout=2.0)
        await run_until_final(db_pool, provider, cipher, db_conn)
        assert server.taken_count() == 1
    trace = traced(db_conn, idempotency_key="login-7")
    assert requests_answer(trace) == "1 logical send from 3 requests"
    (send,) = trace.sends
    assert send.ownership == Ownership.ONE_WORKER
    assert (send.copies.accepted, send.copies.possible) == (1, 0)
    by_aggregate = traced(db_conn, aggregate_id="user-7")
    assert [s.outbox_id for s in by_aggregate.sends] == [send.outbox_id]
