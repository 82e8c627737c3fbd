"""A real worker against a hostile SMTP server: every fault, the same invariants.

Each scenario seeds encrypted OTPs, runs the worker with the real SMTP provider until every
row is final, and judges the run by what the server took per delivery key (see
`support.fault_rig.judge`). Only scenarios that inject an ambiguous outcome (the server took
the message and the answer was lost) may show a second copy, and then one per attempt. Every
scenario runs twice: against a server that offers PIPELINING (the envelope in one write) and
one that does not (one command at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.providers.base import derived_message_id
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.runtime.worker import Worker
from support import hostile_smtp as smtp
from support.fault_rig import SETTINGS, Run, judge, rows, run_until_final, seed
from support.history import events, histories

MESSAGES = 12
pytestmark = pytest.mark.slow


@pytest.fixture(params=[False, True], ids=["one command at a time", "pipelining"])
def pipelining(request: pytest.FixtureRequest) -> bool:
    """Whether the server offers PIPELINING."""
    return bool(request.param)


@dataclass(frozen=True)
class Ran:
    """A scenario after its run: the server's records, the message keys, the worker's run."""

    server: smtp.HostileSmtpServer
    keys: list[str]
    run: Run


async def scenario(
    name: str,
    script: smtp.Script | Callable[[list[str]], smtp.Script],
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    *,
    pipelining: bool,
    query: str = "pool_size=2",
    duplicates: bool = False,
    messages: int = MESSAGES,
) -> Ran:
    seeded = seed(db_conn, cipher, messages)
    if not isinstance(script, smtp.Script):
        script = script(seeded.keys)
    script.pipelining = pipelining
    name = f"{name}, pipelined" if pipelining else name
    with smtp.hostile_smtp(script) as server:
        provider = provider_from_url(server.url(query), timeout=2.0)
        run = await run_until_final(db_pool, provider, cipher, db_conn)
        judge(name, db_conn, seeded, server.copies, run, duplicates=duplicates)
        for key in seeded.keys:  # every copy of a message carries the one Message-ID
            assert {c.message_id for c in server.taken(key)} <= {derived_message_id(key)}
    return Ran(server, seeded.keys, run)


def retries(worker: Worker, code: str) -> float:
    return worker.metrics.value("leasebox_retries_total", {"kind": "otp", "error_class": code})


async def test_a_well_behaved_server_takes_each_message_once(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    ran = await scenario(
        "smtp: accept", smtp.Script(), db_pool, db_conn, cipher, pipelining=pipelining
    )
    assert all(len(ran.server.taken(k)) == 1 for k in ran.keys)
    assert {r["status"] for r in rows(db_conn).values()} == {"sent"}


async def test_a_drop_after_the_whole_message_is_never_resent_within_the_attempt(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.DROP if nth == 1 else smtp.ACCEPT)
    ran = await scenario(
        "smtp: drop before 250, once",
        script,
        db_pool,
        db_conn,
        cipher,
        pipelining=pipelining,
        duplicates=True,
    )
    found = rows(db_conn)
    told = histories(db_conn)
    for key in ran.keys:
        assert [c.attempt for c in ran.server.taken(key)] == [1, 2]
        assert (found[key]["status"], found[key]["attempts"]) == ("sent", 2)
        # The history says the first attempt was ambiguous, not a plain retry, then sent.
        history = told[found[key]["id"]]
        assert events(history) == ["claimed", "ambiguous", "claimed", "sent"]
        assert history[1].error_class == "ambiguous"
        assert history[1].retry_delay_seconds is not None
        assert history[1].retry_delay_seconds > 0
        assert history[3].provider_message_id == found[key]["provider_message_id"]
    assert retries(ran.run.worker, "ambiguous") == MESSAGES


async def test_a_server_that_always_drops_before_250_gets_one_copy_per_attempt(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.DROP)
    ran = await scenario(
        "smtp: drop before 250, always",
        script,
        db_pool,
        db_conn,
        cipher,
        pipelining=pipelining,
        duplicates=True,
    )
    found = rows(db_conn)
    for key in ran.keys:
        assert [c.attempt for c in ran.server.taken(key)] == list(
            range(1, SETTINGS.max_attempts + 1)
        )
        row = found[key]
        assert (row["status"], row["dead_reason"]) == ("dead", "possibly_delivered")
        assert row["last_error_class"] == "ambiguous"
        assert row["last_error"].startswith("ambiguous, possibly delivered: ")
        assert "may have been accepted" in row["last_error"]
        history = histories(db_conn)[row["id"]]
        tries = SETTINGS.max_attempts - 1
        assert events(history) == ["claimed", "ambiguous"] * tries + ["claimed", "dead"]
        assert (history[-1].dead_reason, history[-1].error_class) == (
            "possibly_delivered",
            "ambiguous",
        )


async def test_a_reply_that_times_out_after_the_message_is_ambiguous_and_retried_later(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    script = smtp.Script(
        reply=lambda key, nth: smtp.SLOW if nth == 1 else smtp.ACCEPT, slow_seconds=5.0
    )
    ran = await scenario(
        "smtp: no reply within the timeout, once",
        script,
        db_pool,
        db_conn,
        cipher,
        pipelining=pipelining,
        query="pool_size=4&timeout=0.5",
        duplicates=True,
    )
    assert all([c.attempt for c in ran.server.taken(k)] == [1, 2] for k in ran.keys)
    told = histories(db_conn)
    assert {tuple(events(h)) for h in told.values()} == {
        ("claimed", "ambiguous", "claimed", "sent")
    }


async def test_a_slow_server_within_the_timeout_takes_each_message_once(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.SLOW, slow_seconds=0.3)
    ran = await scenario(
        "smtp: slow (0.3 s per message)", script, db_pool, db_conn, cipher, pipelining=pipelining
    )
    assert ran.run.worker.metrics.value("leasebox_sent_total", {"kind": "otp"}) == MESSAGES


async def test_garbage_in_replies_is_stored_cleaned_and_never_stops_the_worker(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    def script(keys: list[str]) -> smtp.Script:
        refused = set(keys[:4])

        def reply(key: str, nth: int) -> str:
            if key in refused:
                return smtp.GARBAGE_DEFER  # refused, with NUL bytes and invalid UTF-8 in the text
            return smtp.GARBAGE

        return smtp.Script(reply)

    ran = await scenario(
        "smtp: NUL, escapes, bad UTF-8", script, db_pool, db_conn, cipher, pipelining=pipelining
    )
    for key, row in rows(db_conn).items():
        if ran.server.taken(key):
            assert row["status"] == "sent"
            continue
        assert (row["status"], row["dead_reason"], row["last_error_class"]) == (
            "dead",
            "attempts_exhausted",
            "smtp_451",
        )
        assert row["last_error"].isprintable()
        assert "\x1b" not in row["last_error"]
        row["last_error"].encode("utf-8")  # storable and printable, whatever the server sent


async def test_a_megabyte_reply_line_after_the_message_is_ambiguous(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.HUGE if nth == 1 else smtp.ACCEPT)
    ran = await scenario(
        "smtp: 1 MB reply line, once",
        script,
        db_pool,
        db_conn,
        cipher,
        pipelining=pipelining,
        duplicates=True,
    )
    assert all(len(ran.server.taken(k)) == 2 for k in ran.keys)


async def test_bursts_of_4xx_are_retried_to_delivery_with_one_copy(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.DEFER if nth <= 3 else smtp.ACCEPT)
    ran = await scenario(
        "smtp: 451 x3, then 250", script, db_pool, db_conn, cipher, pipelining=pipelining
    )
    found = rows(db_conn)
    assert all((found[k]["status"], found[k]["attempts"]) == ("sent", 4) for k in ran.keys)
    assert all(ran.server.refused[k] == 3 for k in ran.keys)


async def test_a_5xx_rejection_dead_letters_at_once_with_nothing_taken(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    script = smtp.Script(reply=lambda key, nth: smtp.REJECT)
    ran = await scenario("smtp: 554", script, db_pool, db_conn, cipher, pipelining=pipelining)
    found = rows(db_conn)
    assert all((found[k]["dead_reason"], found[k]["attempts"]) == ("rejected", 1) for k in ran.keys)
    assert ran.server.taken_count() == 0


async def test_one_connection_serves_the_pool_and_no_wait_exceeds_the_timeout(
    db_pool: AsyncConnectionPool,
    db_conn: psycopg.Connection[Any],
    cipher: PayloadCipher,
    pipelining: bool,
) -> None:
    # Pool size 1, concurrency 4, sends of 0.2 s and a timeout of 0.5 s: some sends wait
    # longer for the connection than the timeout allows, fail as `pool_timeout` with nothing
    # sent, and are retried; every message still ends sent, once.
    script = smtp.Script(reply=lambda key, nth: smtp.SLOW, slow_seconds=0.2, pipelining=pipelining)
    settings = replace(SETTINGS, max_attempts=20)
    seeded = seed(db_conn, cipher, MESSAGES)
    with smtp.hostile_smtp(script) as server:
        provider = provider_from_url(server.url("pool_size=1&timeout=0.5"), timeout=0.5)
        run = await run_until_final(db_pool, provider, cipher, db_conn, settings=settings)
        judge("smtp: pool of 1, waits over the timeout", db_conn, seeded, server.copies, run)
    assert {r["status"] for r in rows(db_conn).values()} == {"sent"}
    assert retries(run.worker, "pool_timeout") > 0
