"""A real worker against a hostile HTTP mail API: every fault, the same invariants.

As for SMTP: each scenario seeds encrypted OTPs, runs the worker with the real HTTP provider
until every row is final and judges the run by what the API took per Idempotency-Key. Only
a dropped connection (the API read the request and never answered) may cause a second copy.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from aiohttp import ClientSession
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.boundary import MAX_MESSAGE_ID_LENGTH
from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.providers.http import HttpProvider, HttpSettings
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.health import HealthServer, build_app
from leasebox.runtime.worker import Worker
from leasebox.testing.ports import free_port
from support import hostile_http as http
from support.fault_rig import SETTINGS, Run, judge, rows, run_until_final, seed

MESSAGES = 12
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Ran:
    server: http.HostileHttpServer
    keys: list[str]
    run: Run


async def scenario(
    name: str,
    script: http.Script | Callable[[list[str]], http.Script],
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    *,
    provider_timeout: float = 2.0,
    duplicates: bool = False,
) -> Ran:
    seeded = seed(db_conn, cipher, MESSAGES)
    if not isinstance(script, http.Script):
        script = script(seeded.keys)
    with http.hostile_http(script) as server:
        provider = provider_from_url(server.url(), timeout=provider_timeout)
        run = await run_until_final(db_pool, provider, cipher, db_conn)
        judge(name, db_conn, seeded, server.copies, run, duplicates=duplicates)
    return Ran(server, seeded.keys, run)


def warnings_of(run: Run) -> list[str]:
    return [r.getMessage() for r in run.logs if r.getMessage().startswith("accepted, but")]


def retries(worker: Worker, code: str) -> float:
    return worker.metrics.value("leasebox_retries_total", {"kind": "otp", "error_class": code})


async def test_a_well_behaved_api_takes_each_message_once(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    ran = await scenario("http: 202 with an id", http.Script(), db_pool, db_conn, cipher)
    found = rows(db_conn)
    assert all(found[k]["provider_message_id"].startswith("msg-") for k in ran.keys)


async def test_ids_with_nul_bytes_surrogates_or_a_megabyte_are_sent_once_and_stored_safely(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    kinds = (http.NUL_ID, http.SURROGATE_ID, http.HUGE_ID, http.GARBAGE_BODY)

    def script(keys: list[str]) -> http.Script:
        chosen = {key: kinds[i % len(kinds)] for i, key in enumerate(keys)}
        return http.Script(reply=lambda key, nth: chosen[key])

    ran = await scenario("http: NUL, surrogate, 1 MB ids", script, db_pool, db_conn, cipher)
    found = rows(db_conn)
    stored = [found[k]["provider_message_id"] for k in ran.keys]
    assert stored[0::4] == ["abc\ufffddef"] * 3  # NUL replaced, visibly
    assert stored[1::4] == ["abc\ufffddef"] * 3  # the lone surrogate too
    assert stored[2::4] == [None] * 3  # a megabyte is no id
    assert stored[3::4] == [None] * 3  # nor is garbage
    assert all(v is None or len(v) <= MAX_MESSAGE_ID_LENGTH for v in stored)
    assert len(warnings_of(ran.run)) == 9
    assert ran.run.worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == MESSAGES


@pytest.mark.parametrize(
    ("reply", "name"),
    [(http.CUT_BODY, "http: 200, body cut off"), (http.STALLED_BODY, "http: 200, body stalls")],
)
async def test_a_2xx_whose_body_cannot_be_read_is_sent_once_with_a_warning(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    reply: str,
    name: str,
) -> None:
    ran = await scenario(
        name,
        http.Script(reply=lambda key, nth: reply),
        db_pool,
        db_conn,
        cipher,
        provider_timeout=0.5,
    )
    found = rows(db_conn)
    assert all((found[k]["status"], found[k]["attempts"]) == ("sent", 1) for k in ran.keys)
    assert all(found[k]["provider_message_id"] is None for k in ran.keys)
    assert len(warnings_of(ran.run)) == MESSAGES
    assert all("reply could not be read" in w for w in warnings_of(ran.run))


async def test_a_connection_dropped_after_the_request_is_ambiguous_and_retried_once(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    script = http.Script(reply=lambda key, nth: http.DROP if nth == 1 else http.OK)
    ran = await scenario(
        "http: dropped before the status, once", script, db_pool, db_conn, cipher, duplicates=True
    )
    assert all([c.attempt for c in ran.server.taken(k)] == [1, 2] for k in ran.keys)
    assert retries(ran.run.worker, "ambiguous") == MESSAGES


async def test_429_with_retry_after_delays_the_next_attempt_at_least_that_long(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    waited: dict[str, float] = {}

    async def watch(worker: Worker) -> None:
        # A throttled row is pending with its next attempt set by the API, not the backoff
        # (base 0.05 s, at most 0.2 s).
        for key, row in rows(db_conn).items():
            if row["last_error_class"] == "http_429" and row["status"] == "pending":
                waited[key] = (row["available_at"] - row["updated_at"]).total_seconds()

    script = http.Script(
        reply=lambda key, nth: http.THROTTLED if nth == 1 else http.OK, retry_after="2"
    )
    seeded = seed(db_conn, cipher, MESSAGES)
    with http.hostile_http(script) as server:
        provider = provider_from_url(server.url(), timeout=2.0)
        run = await run_until_final(db_pool, provider, cipher, db_conn, while_running=watch)
        judge("http: 429 Retry-After 2, then 202", db_conn, seeded, server.copies, run)
    assert set(waited) == set(seeded.keys)
    assert all(seconds >= 2.0 for seconds in waited.values()), waited
    assert retries(run.worker, "http_429") == MESSAGES


async def test_bursts_of_5xx_are_retried_to_delivery_with_one_copy(
    db_pool: AsyncConnectionPool, db_conn: psycopg.Connection[Any], cipher: PayloadCipher
) -> None:
    script = http.Script(reply=lambda key, nth: http.UNAVAILABLE if nth <= 3 else http.OK)
    ran = await scenario("http: 503 x3, then 202", script, db_pool, db_conn, cipher)
    found = rows(db_conn)
    assert all((found[k]["status"], found[k]["attempts"]) == ("sent", 4) for k in ran.keys)
    assert all(ran.server.refused[k] == [http.UNAVAILABLE] * 3 for k in ran.keys)
    assert retries(ran.run.worker, "http_503") == 3 * MESSAGES


async def test_readyz_says_not_ready_while_the_api_refuses_connections(
    db_pool: AsyncConnectionPool, cipher: PayloadCipher
) -> None:
    port = free_port()
    provider = HttpProvider(
        HttpSettings(endpoint=f"http://127.0.0.1:{port}/send"), check_interval=0
    )
    worker = Worker(SETTINGS, db_pool, provider, TemplateRenderer(), cipher=cipher)
    health = HealthServer(
        build_app(worker.metrics, worker.readiness_problem, details=worker.status_lines),
        "127.0.0.1",
    )
    await provider.start()
    await health.start()
    try:
        async with ClientSession() as session:
            url = f"http://127.0.0.1:{health.port}/readyz"
            async with session.get(url) as response:
                refused = (response.status, await response.text())
            listener = socket.create_server(("127.0.0.1", port))
            try:
                async with session.get(url) as response:
                    reachable = (response.status, await response.text())
            finally:
                listener.close()
    finally:
        await health.stop()
        await provider.close()
    assert refused[0] == 503
    assert refused[1].startswith(f"not ready: provider: cannot reach http://127.0.0.1:{port}/send")
    assert reachable == (200, "ready\nsecrets: encrypted (1 key)\n")
