"""The HTTP provider's readiness is a cached reachability check, and its replies are read by
status: a 429's Retry-After reaches the worker, a 2xx is an acceptance whatever its body."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from leasebox.delivery.providers import Email, TransientProviderError, provider_from_url
from leasebox.delivery.providers.http import HttpProvider, HttpSettings
from leasebox.errors import AmbiguousProviderError
from leasebox.testing.ports import free_port
from support import hostile_http as http


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def email() -> Email:
    return Email(
        outbox_id=1,
        kind="otp",
        aggregate_id="u",
        delivery_key="otp:k",
        recipient="ada@example.com",
        subject="s",
        text="t",
        html=None,
        attempt=1,
    )


@pytest.fixture
def server() -> Iterator[http.HostileHttpServer]:
    with http.hostile_http() as running:
        yield running


async def test_readiness_says_when_the_api_refuses_connections_and_caches_the_answer() -> None:
    port = free_port()
    clock = Clock()
    provider = HttpProvider(
        HttpSettings(endpoint=f"http://127.0.0.1:{port}/send"), check_interval=10, clock=clock
    )
    await provider.start()
    listener = None
    try:
        down = await provider.check()
        listener = socket.create_server(("127.0.0.1", port))  # the API comes back
        cached = await provider.check()
        clock.now += 10
        up = await provider.check()
        listener.close()
        listener = None
        cached_up = await provider.check()
        clock.now += 10
        down_again = await provider.check()
    finally:
        if listener is not None:
            listener.close()
        await provider.close()
    assert down is not None
    assert down.startswith(f"cannot reach http://127.0.0.1:{port}/send")
    assert cached == down  # within the interval, no new connection
    assert up is None
    assert cached_up is None
    assert down_again is not None


async def test_readiness_of_a_reachable_api_costs_it_no_request(
    server: http.HostileHttpServer,
) -> None:
    provider = provider_from_url(server.url(), timeout=5.0)
    await provider.start()
    try:
        assert await provider.check() is None
    finally:
        await provider.close()
    assert server.seen == {}


@pytest.mark.parametrize(("header", "seconds"), [("7", 7.0), ("0", None), ("soon", None)])
async def test_a_429_carries_its_retry_after_to_the_worker(
    server: http.HostileHttpServer, header: str, seconds: float | None
) -> None:
    server.script = http.Script(reply=lambda key, nth: http.THROTTLED, retry_after=header)
    provider = provider_from_url(server.url(), timeout=5.0)
    await provider.start()
    try:
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(email())
    finally:
        await provider.close()
    assert caught.value.code == "http_429"
    assert caught.value.retry_after == seconds


@pytest.mark.parametrize(
    ("reply", "warning"),
    [
        (http.CUT_BODY, "the reply could not be read (ClientPayloadError)"),
        (http.STALLED_BODY, "the reply could not be read (TimeoutError)"),
        (http.HUGE_ID, "with a reply over 65536 bytes, not read"),
    ],
)
async def test_a_2xx_whose_body_cannot_be_used_is_an_acceptance_with_a_warning(
    server: http.HostileHttpServer, reply: str, warning: str
) -> None:
    server.script = http.Script(reply=lambda key, nth: reply)
    provider = provider_from_url(server.url(), timeout=0.5)
    await provider.start()
    try:
        result = await provider.send(email())
    finally:
        await provider.close()
    assert result.provider_message_id is None
    assert result.warning is not None
    assert warning in result.warning


async def test_a_connection_closed_before_the_status_is_ambiguous(
    server: http.HostileHttpServer,
) -> None:
    server.script = http.Script(reply=lambda key, nth: http.DROP)
    provider = provider_from_url(server.url(), timeout=5.0)
    await provider.start()
    try:
        with pytest.raises(AmbiguousProviderError) as caught:
            await provider.send(email())
        await asyncio.sleep(0)
    finally:
        await provider.close()
    assert caught.value.code == "ambiguous"
    assert len(server.taken("otp:k")) == 1  # aiohttp did not send it again by itself
