"""The HTTP provider against a real aiohttp server on loopback.

The server's behaviour is chosen by path: `/ok` answers 202 with a JSON id, `/header-id` puts
the id in `X-Message-Id`, `/status/<n>` answers status n, `/slow` never answers in time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from leasebox.delivery.providers import (
    Email,
    PermanentProviderError,
    TransientProviderError,
    provider_from_url,
)
from leasebox.delivery.providers.base import parse_retry_after
from leasebox.delivery.providers.http import HttpProvider
from leasebox.testing.ports import free_port

CODE = "771204"
TOKEN = "sk_test_d41d8cd98f00b204"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    query: dict[str, str]
    body: Any


@dataclass
class MailApi:
    server: TestServer
    received: list[Received] = field(default_factory=list)

    def url(self, path: str, *, userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"http://{at}127.0.0.1:{self.server.port}{path}"


@pytest.fixture
async def api() -> AsyncIterator[MailApi]:
    received: list[Received] = []
    never = asyncio.Event()

    async def record(request: web.Request) -> None:
        received.append(
            Received(request.path, dict(request.headers), dict(request.query), await request.json())
        )

    async def ok(request: web.Request) -> web.Response:
        await record(request)
        return web.json_response({"id": "msg_123", "status": "queued"}, status=202)

    async def header_id(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=200, text="accepted", headers={"X-Message-Id": "hdr_9"})

    async def status(request: web.Request) -> web.Response:
        await record(request)
        body = await request.text()  # an API echoing the request back must not leak it
        return web.Response(status=int(request.match_info["code"]), text=body)

    async def slow(request: web.Request) -> web.Response:
        await record(request)
        await never.wait()
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_post("/header-id", header_id)
    app.router.add_post("/status/{code}", status)
    app.router.add_post("/slow", slow)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield MailApi(server, received)
    finally:
        await server.close()


def email(key: str = "verification:user-7:1") -> Email:
    return Email(
        outbox_id=41,
        kind="verification",
        aggregate_id="user-7",
        delivery_key=key,
        recipient="grace@example.com",
        subject="Confirm your email address",
        text=f"Your code is {CODE}",
        html=f"<p>{CODE}</p>",
        attempt=3,
    )


async def send(url: str, message: Email | None = None) -> tuple[HttpProvider, Any]:
    provider = provider_from_url(url, timeout=5.0)
    assert isinstance(provider, HttpProvider)
    await provider.start()
    try:
        return provider, await provider.send(message or email())
    finally:
        await provider.close()


async def test_the_idempotency_key_is_the_delivery_key_and_the_body_is_the_documented_json(
    api: MailApi,
) -> None:
    _, result = await send(api.url("/ok"))

    [request] = api.received
    assert request.headers["Idempotency-Key"] == "verification:user-7:1"
    assert request.headers["Content-Type"].startswith("application/json")
    assert request.headers["User-Agent"].startswith("leasebox/")
    assert "Authorization" not in request.headers
    assert request.body == {
        "to": "grace@example.com",
        "subject": "Confirm your email address",
        "text": f"Your code is {CODE}",
        "html": f"<p>{CODE}</p>",
        "delivery_key": "verification:user-7:1",
        "kind": "verification",
        "metadata": {"outbox_id": 41, "aggregate_id": "user-7", "attempt": 3},
    }
    assert result.provider_message_id == "msg_123"


async def test_the_message_id_may_come_from_the_x_message_id_header(api: MailApi) -> None:
    _, result = await send(api.url("/header-id"))

    assert result.provider_message_id == "hdr_9"


async def test_a_token_in_the_url_password_becomes_a_bearer_header(api: MailApi) -> None:
    provider, _ = await send(api.url("/ok", userinfo=f":{TOKEN}"))

    assert api.received[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in repr(provider)
    assert TOKEN not in repr(provider.settings)
    assert TOKEN not in provider.settings.endpoint


async def test_a_token_may_be_read_from_the_environment_variable_named_by_token_env(
    api: MailApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEASEBOX_TEST_MAIL_TOKEN", TOKEN)

    await send(api.url("/ok?token_env=LEASEBOX_TEST_MAIL_TOKEN"))

    assert api.received[0].headers["Authorization"] == f"Bearer {TOKEN}"


async def test_unknown_query_options_go_to_the_api_and_leasebox_options_do_not(
    api: MailApi,
) -> None:
    await send(api.url("/ok?api-version=2024-01&timeout=3&tls_verify=false&from=a%40example.com"))

    request = api.received[0]
    assert request.query == {"api-version": "2024-01"}
    assert request.body["from"] == "a@example.com"


@pytest.mark.parametrize("status", [401, 403, 408, 429, 500, 502, 503, 504])
async def test_a_retryable_status_is_a_transient_error(api: MailApi, status: int) -> None:
    with pytest.raises(TransientProviderError) as caught:
        await send(api.url(f"/status/{status}"))

    assert caught.value.code == f"http_{status}"
    assert str(caught.value).startswith(f"HTTP {status} ")
    assert CODE not in str(caught.value)


@pytest.mark.parametrize("status", [400, 404, 409, 422])
async def test_any_other_4xx_is_a_permanent_error_that_does_not_quote_the_response(
    api: MailApi, status: int
) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await send(api.url(f"/status/{status}?api_key=query-secret"))

    assert caught.value.code == f"http_{status}"
    assert f"from http://127.0.0.1:{api.server.port}/status/{status}" in str(caught.value)
    assert CODE not in str(caught.value)
    assert "grace@example.com" not in str(caught.value)
    assert "query-secret" not in str(caught.value)


async def test_a_server_slower_than_the_timeout_is_a_transient_timeout(api: MailApi) -> None:
    with pytest.raises(TransientProviderError) as caught:
        await send(api.url("/slow?timeout=0.2"))

    assert caught.value.code == "timeout"
    assert "did not answer within 0.2s" in str(caught.value)


async def test_a_refused_connection_is_a_transient_connection_error() -> None:
    port = free_port()

    with pytest.raises(TransientProviderError) as caught:
        await send(f"http://:{TOKEN}@127.0.0.1:{port}/send")

    assert caught.value.code == "connection"
    assert f"cannot reach http://127.0.0.1:{port}/send" in str(caught.value)
    assert TOKEN not in str(caught.value)


async def test_check_reports_a_provider_that_is_not_started_or_closed(api: MailApi) -> None:
    provider = provider_from_url(api.url("/ok"))

    before = await provider.check()
    await provider.start()
    running = await provider.check()
    await provider.close()
    after = await provider.check()

    assert before == after == "the HTTP provider is not started"
    assert running is None


async def test_concurrent_sends_share_one_session_and_all_arrive(api: MailApi) -> None:
    provider = provider_from_url(api.url("/ok"))
    await provider.start()
    try:
        await asyncio.gather(*(provider.send(email(key=f"k{n}")) for n in range(32)))
    finally:
        await provider.close()

    assert sorted(r.headers["Idempotency-Key"] for r in api.received) == sorted(
        f"k{n}" for n in range(32)
    )


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        ("Wed, 21 Oct 2026 07:28:30 GMT", 30.0),
        ("Wed, 21 Oct 2026 07:27:00 GMT", None),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(
    header: str | None, seconds: float | None
) -> None:
    now = datetime(2026, 10, 21, 7, 28, 0, tzinfo=UTC)
    assert parse_retry_after(header, now) == seconds
