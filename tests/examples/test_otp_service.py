"""The example OTP service (`examples/otp_service`) on real PostgreSQL, served by uvicorn.

The service runs in a real uvicorn server on a free loopback port, inside the test's event
loop, and is spoken to over HTTP, as a client would.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import psycopg
import pytest
import uvicorn
from examples.otp_service.app import create_app

from leasebox.cli.main import main
from leasebox.producer.payload_crypto import PayloadCipher, generate_key
from leasebox.testing.ports import free_port


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


@dataclass
class Client:
    session: aiohttp.ClientSession
    base: str

    async def post(self, email: str, key: str | None) -> Answer:
        headers = {"Idempotency-Key": key} if key else {}
        async with self.session.post(
            f"{self.base}/otp", json={"email": email}, headers=headers
        ) as response:
            return Answer(response.status, dict(response.headers), await response.json())


@pytest.fixture
def payload_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = generate_key()
    monkeypatch.setenv("LEASEBOX_PAYLOAD_KEYS", key)
    return key


@pytest.fixture
async def client(db_dsn: str, payload_key: str) -> AsyncIterator[Client]:
    port = free_port()
    config = uvicorn.Config(
        create_app(db_dsn, per_address_per_hour=3),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve())
    async with asyncio.timeout(30):
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.01)
    try:
        async with aiohttp.ClientSession() as session:
            yield Client(session, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        async with asyncio.timeout(30):
            await serving


def rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


async def test_a_request_commits_the_challenge_and_its_outbox_row_together(
    client: Client, db_dsn: str, payload_key: str
) -> None:
    answer = await client.post("ada@example.com", "req-1")

    assert answer.status == 202
    assert answer.body["reused"] is False
    [(challenge_id, email, code_hash)] = rows(
        db_dsn, "SELECT id, email, code_sha256 FROM otp_challenges"
    )
    assert (challenge_id, email) == (answer.body["challenge_id"], "ada@example.com")
    [(outbox_id, aggregate_id, sealed, status)] = rows(
        db_dsn,
        "SELECT o.id, o.aggregate_id, o.secrets, m.status"
        " FROM leasebox.outbox AS o JOIN leasebox.messages AS m USING (id)",
    )
    assert (outbox_id, aggregate_id, status) == (answer.body["outbox_id"], challenge_id, "pending")
    code = PayloadCipher([payload_key]).open(bytes(sealed))["code"]
    assert hashlib.sha256(code.encode()).hexdigest() == code_hash


async def test_a_retried_request_answers_with_the_first_challenge_and_creates_nothing(
    client: Client, db_dsn: str
) -> None:
    first = await client.post("ada@example.com", "req-1")
    again = await client.post("ada@example.com", "req-1")

    assert again.status == 202
    assert again.body == {**first.body, "reused": True}
    assert rows(db_dsn, "SELECT count(*) FROM otp_challenges") == [(1,)]
    assert rows(db_dsn, "SELECT count(*) FROM leasebox.outbox") == [(1,)]


async def test_every_retried_request_is_counted_and_traced_after_the_example_commits_it(
    client: Client, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The example commits a reused receipt (adding nothing) rather than rolling it back: a
    # rollback would erase the retry from the receipt, and the trace would say 1 request.
    answers = [await client.post("ada@example.com", "req-1") for _ in range(4)]

    assert [a.body["reused"] for a in answers] == [False, True, True, True]
    assert rows(db_dsn, "SELECT reuse_count FROM leasebox.receipts") == [(3,)]
    assert main(["trace", "--dsn", db_dsn, "--id", str(answers[0].body["outbox_id"])]) == 0
    assert "1 logical send from 4 requests" in capsys.readouterr().out


async def test_the_same_key_for_another_address_is_422_and_writes_nothing(
    client: Client, db_dsn: str
) -> None:
    await client.post("ada@example.com", "req-1")
    answer = await client.post("eve@example.com", "req-1")

    assert answer.status == 422
    assert rows(db_dsn, "SELECT email FROM otp_challenges") == [("ada@example.com",)]


async def test_too_many_codes_to_one_address_is_429_with_retry_after(
    client: Client, db_dsn: str
) -> None:
    for n in range(3):
        assert (await client.post("ada@example.com", f"req-{n}")).status == 202
    answer = await client.post("ada@example.com", "req-4")

    assert answer.status == 429
    assert 1 <= int(answer.headers["Retry-After"]) <= 3600
    assert rows(db_dsn, "SELECT count(*) FROM otp_challenges") == [(3,)]


async def test_a_request_without_an_idempotency_key_or_with_a_bad_address_is_refused(
    client: Client, db_dsn: str
) -> None:
    assert (await client.post("ada@example.com", None)).status == 400
    assert (await client.post("not an address", "req-9")).status == 422
    assert rows(db_dsn, "SELECT count(*) FROM leasebox.outbox") == [(0,)]
