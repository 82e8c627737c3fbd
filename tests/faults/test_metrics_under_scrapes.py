"""`/metrics` under a flood of scrapes: rendered off the event loop, a bounded number at once.

The worker's sends, its lease keeper and its `/healthz` share one event loop. Rendering the
registry on it let 1,000 concurrent scrapes cut sends by 87 % and hold a `/healthz` for 10 s.
Here a collector that blocks stands for a slow render: `/healthz` must answer while it
blocks, one render serves every scrape waiting for it, and scrapes beyond the bound are
turned away at once instead of piling up.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from leasebox.runtime.health import MAX_WAITING_SCRAPES, HealthServer, build_app
from leasebox.runtime.metrics import WorkerMetrics

SCRAPES = 40


class SlowCollector:
    """A collector that records the thread it runs on and blocks until released."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.release = threading.Event()
        self.rendering = threading.Event()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        self.rendering.set()
        if len(self.threads) == 1:
            # Bounded only so that a render on the event loop (which no one could release)
            # ends the test with a failure rather than hanging it.
            self.release.wait(timeout=10)
        yield GaugeMetricFamily("leasebox_test_slow", "A slow collector.", value=1)


async def test_a_slow_render_never_stalls_the_event_loop_and_scrapes_are_bounded() -> None:
    metrics = WorkerMetrics()
    slow = SlowCollector()
    metrics.registry.register(slow)
    server = HealthServer(build_app(metrics, readiness=_ready), "127.0.0.1", 0)
    await server.start()
    loop_thread = threading.get_ident()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as client:

            async def scrape() -> tuple[int, str]:
                async with client.get(f"{base}/metrics") as response:
                    return response.status, await response.text()

            scrapes = [asyncio.ensure_future(scrape()) for _ in range(SCRAPES)]
            await asyncio.to_thread(slow.rendering.wait, 10)
            assert slow.rendering.is_set(), "no render started"
            # The loop is free while the render blocks: health answers at once.
            async with asyncio.timeout(5), client.get(f"{base}/healthz") as health:
                assert health.status == 200
            assert loop_thread not in slow.threads, "the registry was rendered on the event loop"
            turned_away = await _turned_away(scrapes, SCRAPES - MAX_WAITING_SCRAPES)
            slow.release.set()
            answers = await asyncio.gather(*scrapes)
    finally:
        slow.release.set()
        await server.stop()
    served = [text for status, text in answers if status == 200]
    assert all("leasebox_test_slow 1.0" in text for text in served)
    assert (len(served), turned_away) == (MAX_WAITING_SCRAPES, SCRAPES - MAX_WAITING_SCRAPES)
    assert len(slow.threads) == 1  # one render served every scrape that waited for it


async def _ready() -> str | None:
    return None


async def _turned_away(scrapes: Sequence[asyncio.Future[tuple[int, str]]], expected: int) -> int:
    """How many scrapes were answered 503 while the render still blocks, once `expected` were
    (or the most seen within 10 s, which the caller's assertion then reports)."""
    deadline = time.monotonic() + 10
    refused = 0
    while refused < expected and time.monotonic() < deadline:
        done = [s.result() for s in scrapes if s.done()]
        assert all(status == 503 for status, _ in done), done
        refused = len(done)
        await asyncio.sleep(0.01)
    assert refused == expected, f"{refused} scrapes turned away while a render blocked"
    return refused
