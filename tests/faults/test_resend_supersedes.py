"""An older code never reaches the SMTP server once a newer code of its replacement key is
committed, however far its send had come, short of its first byte on the wire.

Each race runs a real worker against a real SMTP server on loopback (aiosmtpd) that holds a
command until the test lets it go, so the newer code is committed at a known point of the
older one's send: while it waits for the provider's only connection, and while the server
sits on its RCPT (after the claim and the worker's own check, before DATA). The older code
must end `superseded`, naming the newer one, with nothing of it written after DATA.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox import OutboxMessage, enqueue
from leasebox.delivery.providers import provider_from_url
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.worker import Worker
from support.fault_rig import rows, run_until_final
from support.mail_servers import RecordingHandler, SmtpServer, serve

pytestmark = pytest.mark.slow

KEY = "login-challenge-42"


@dataclass
class HoldingHandler(RecordingHandler):
    """Records like `RecordingHandler`; holds the RCPT or the DATA of some recipients until
    `release` is set, saying so by `holding`."""

    hold_rcpt: frozenset[str] = frozenset()
    hold_data: frozenset[str] = frozenset()
    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    async def _hold(self) -> None:
        self.holding.set()
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 30)

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if address in self.hold_rcpt:
            await self._hold()
        return await super().handle_RCPT(server, session, envelope, address, options)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if envelope.rcpt_tos and envelope.rcpt_tos[0] in self.hold_data:
            await self._hold()
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def holding() -> HoldingHandler:
    return HoldingHandler()


@pytest.fixture
def holding_server(holding: HoldingHandler) -> Iterator[SmtpServer]:
    try:
        yield from serve(holding)
    finally:
        holding.release.set()


def code(
    conn: psycopg.Connection[Any], cipher: PayloadCipher, recipient: str, key: str | None
) -> int:
    """An OTP with its own code, committed; its outbox id."""
    receipt = enqueue(
        conn,
        OutboxMessage(
            kind="otp",
            recipient=recipient,
            aggregate_id="user-42",
            secrets={"code": recipient.split("@")[0]},
            replacement_key=key,
        ),
        cipher=cipher,
    )
    conn.commit()
    return receipt.outbox_id


def delivered_to(handler: RecordingHandler) -> list[str]:
    return [address for d in handler.delivered for address in d.rcpt_tos]


def superseded_by(conn: psycopg.Connection[Any], outbox_id: int) -> tuple[str, int | None]:
    row = conn.execute(
        "SELECT status, superseded_by FROM leasebox.messages WHERE id = %s", (outbox_id,)
    ).fetchone()
    conn.rollback()
    assert row is not None
    return row[0], row[1]


async def test_a_code_replaced_while_it_waits_for_the_connection_is_never_sent(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    holding: HoldingHandler,
    holding_server: SmtpServer,
) -> None:
    # The provider's one connection is busy with another message the server holds; the old
    # code, claimed and checked by the worker, queues for that connection.
    holding.hold_data = frozenset({"busy@example.com"})
    code(db_conn, cipher, "busy@example.com", None)
    steps: list[int] = []

    async def resend_while_it_waits(worker: Worker) -> None:
        if not steps and holding.holding.is_set():
            steps.append(code(db_conn, cipher, "old@example.com", KEY))
        elif len(steps) == 1 and worker.metrics.value("leasebox_inflight_sends") == 2:
            steps.append(code(db_conn, cipher, "new@example.com", KEY))
            holding.release.set()

    provider = provider_from_url(holding_server.url("pool_size=1"), timeout=30.0)
    run = await run_until_final(
        db_pool, provider, cipher, db_conn, while_running=resend_while_it_waits
    )

    old, new = steps
    assert superseded_by(db_conn, old) == ("superseded", new)
    assert superseded_by(db_conn, new) == ("sent", None)
    assert sorted(delivered_to(holding)) == ["busy@example.com", "new@example.com"]
    assert run.worker.metrics.value("leasebox_superseded_total", {"kind": "otp"}) == 1


async def test_a_code_replaced_between_its_claim_and_data_is_stopped_at_the_354(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    holding: HoldingHandler,
    holding_server: SmtpServer,
) -> None:
    # The server sits on the old code's RCPT: the worker claimed it and found nothing newer,
    # the provider opened its connection and wrote MAIL and RCPT; DATA is still to come.
    holding.hold_rcpt = frozenset({"old@example.com"})
    old = code(db_conn, cipher, "old@example.com", KEY)
    newer: list[int] = []

    async def resend_before_data(worker: Worker) -> None:
        if not newer and holding.holding.is_set():
            newer.append(code(db_conn, cipher, "new@example.com", KEY))
            holding.release.set()

    provider = provider_from_url(holding_server.url(), timeout=30.0)
    run = await run_until_final(
        db_pool, provider, cipher, db_conn, while_running=resend_before_data
    )

    [new] = newer
    assert superseded_by(db_conn, old) == ("superseded", new)
    assert superseded_by(db_conn, new) == ("sent", None)
    assert delivered_to(holding) == ["new@example.com"], "the old code's DATA never completed"
    assert run.worker.metrics.value("leasebox_superseded_total", {"kind": "otp"}) == 1
    claims = db_conn.execute(
        "SELECT event FROM leasebox.history WHERE outbox_id = %s ORDER BY id", (old,)
    ).fetchall()
    db_conn.rollback()
    assert [e for (e,) in claims] == ["claimed", "superseded"]


async def test_a_code_with_no_newer_one_is_sent_through_the_check(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    holding_server: SmtpServer,
    holding: HoldingHandler,
) -> None:
    first = code(db_conn, cipher, "first@example.com", "challenge-1")
    other = code(db_conn, cipher, "other@example.com", "challenge-2")

    provider = provider_from_url(holding_server.url(), timeout=30.0)
    await run_until_final(db_pool, provider, cipher, db_conn)

    assert {r["id"]: r["status"] for r in rows(db_conn).values()} == {
        first: "sent",
        other: "sent",
    }
    assert sorted(delivered_to(holding)) == ["first@example.com", "other@example.com"]
