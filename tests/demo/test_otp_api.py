"""The reference OTP API keeps one challenge per key and writes it with its email atomically."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from psycopg_pool import AsyncConnectionPool

from leasebox.demo.otp_api import OtpApiSettings, build_app, code_digest, create_schema
from leasebox.producer.guard import AbuseGuard
from leasebox.producer.payload_crypto import KEYS_VARIABLE, generate_key

BODY = {"email": "ada@example.com", "user_id": "user-1"}


async def _client(dsn: str, settings: OtpApiSettings) -> AsyncIterator[TestClient[Any, Any]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await create_schema(conn, settings.schema)
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
    await pool.open()
    client = TestClient(TestServer(build_app(pool, settings)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        await pool.close()


@pytest.fixture
def settings() -> OtpApiSettings:
    return OtpApiSettings()


@pytest.fixture
async def api(
    db_dsn: str, settings: OtpApiSettings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[TestClient[Any, Any]]:
    monkeypatch.setenv(KEYS_VARIABLE, generate_key())
    async for client in _client(db_dsn, settings):
        yield client


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


async def post(
    api: TestClient[Any, Any], body: Any, key: str | None = "key-1"
) -> tuple[int, dict[str, Any]]:
    headers = {"Idempotency-Key": key} if key is not None else {}
    response = await api.post("/otp/email", json=body, headers=headers)
    return response.status, await response.json()


async def test_a_retried_request_gets_the_same_challenge_and_one_email(
    api: TestClient[Any, Any], db_dsn: str
) -> None:
    first_status, first = await post(api, BODY)
    second_status, second = await post(api, BODY)
    assert (first_status, second_status) == (201, 200)
    assert second["challenge_id"] == first["challenge_id"]
    assert second["replayed"] is True
    assert count(db_dsn, "leasebox.outbox") == 1
    assert count(db_dsn, "demo.challenges") == 1


async def test_concurrent_requests_with_one_key_share_one_challenge(
    api: TestClient[Any, Any], db_dsn: str
) -> None:
    answers = await asyncio.gather(*(post(api, BODY) for _ in range(5)))
    assert sorted(status for status, _ in answers) == [200, 200, 200, 200, 201]
    assert len({payload["challenge_id"] for _, payload in answers}) == 1
    assert count(db_dsn, "leasebox.outbox") == 1


async def test_a_reused_key_with_a_different_body_is_refused_with_422(
    api: TestClient[Any, Any], db_dsn: str
) -> None:
    await post(api, BODY)
    status, payload = await post(api, {**BODY, "email": "eve@example.com"})
    assert status == 422
    assert "Idempotency-Key" in payload["error"]
    assert count(db_dsn, "leasebox.outbox") == 1


async def test_a_request_without_an_idempotency_key_is_refused_with_400(
    api: TestClient[Any, Any], db_dsn: str
) -> None:
    status, payload = await post(api, BODY, key=None)
    assert status == 400
    assert payload["field"] == "Idempotency-Key"
    assert count(db_dsn, "leasebox.outbox") == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"email": "not-an-address"}, "email"),
        ({"user_id": "user-1"}, "email"),
        ({"email": "ada@example.com", "user_id": "has space"}, "user_id"),
        ({"email": "ada@example.com", "code": "123456"}, "code"),
    ],
)
async def test_a_bad_body_is_refused_with_400_naming_the_field(
    api: TestClient[Any, Any], db_dsn: str, body: dict[str, Any], field: str
) -> None:
    status, payload = await post(api, body)
    assert status == 400
    assert payload["field"] == field
    assert count(db_dsn, "leasebox.outbox") == 0


async def test_the_code_is_stored_hashed_and_encrypted_never_in_the_clear(
    api: TestClient[Any, Any], db_dsn: str, settings: OtpApiSettings
) -> None:
    status, payload = await post(api, BODY)
    assert status == 201
    assert "code" not in payload
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT c.code_hash, o.secrets, o.delivery_key, c.outbox_id = o.id "
            "FROM demo.challenges AS c JOIN leasebox.outbox AS o ON o.id = c.outbox_id"
        ).fetchone()
    assert row is not None
    code_hash, sealed, delivery_key, linked = row
    assert linked
    assert bytes(sealed).startswith(b"f1:"), "secrets are not encrypted at rest"
    assert delivery_key == f"otp:user-1:{payload['challenge_id']}"
    from leasebox.producer.payload_crypto import default_cipher

    code = default_cipher().open(bytes(sealed))["code"]
    assert code.isdigit()
    assert len(code) == settings.code_digits
    assert code_hash == code_digest(settings.pepper, payload["challenge_id"], code)
    assert code not in code_hash


async def test_a_failure_after_the_outbox_insert_leaves_neither_row(
    api: TestClient[Any, Any], db_dsn: str
) -> None:
    with psycopg.connect(db_dsn) as conn:
        conn.execute(
            "CREATE FUNCTION demo.refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END; $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse AFTER INSERT ON demo.challenges "
            "FOR EACH ROW EXECUTE FUNCTION demo.refuse()"
        )
        conn.commit()
    response = await api.post("/otp/email", json=BODY, headers={"Idempotency-Key": "k"})
    assert response.status == 500
    assert count(db_dsn, "leasebox.outbox") == 0
    assert count(db_dsn, "leasebox.receipts") == 0
    assert count(db_dsn, "demo.challenges") == 0


@pytest.mark.parametrize("settings", [OtpApiSettings(guard=AbuseGuard(per_recipient=1))])
async def test_too_many_codes_for_one_address_get_429_with_retry_after(
    api: TestClient[Any, Any],
) -> None:
    assert (await post(api, BODY, key="first"))[0] == 201
    response = await api.post("/otp/email", json=BODY, headers={"Idempotency-Key": "second"})
    assert response.status == 429
    assert int(response.headers["Retry-After"]) >= 1


async def test_a_challenge_shows_its_delivery_state_but_not_its_code(
    api: TestClient[Any, Any],
) -> None:
    _, created = await post(api, BODY)
    response = await api.get(f"/otp/challenges/{created['challenge_id']}")
    payload = await response.json()
    assert response.status == 200
    assert payload["email_status"] == "pending"
    assert "code" not in payload
    assert "code_hash" not in payload
    assert (await api.get("/otp/challenges/not-a-uuid")).status == 404
