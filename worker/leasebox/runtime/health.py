"""The worker's HTTP side: `/metrics` for Prometheus, `/healthz` and `/readyz` for Kubernetes.

Liveness and readiness answer different questions. `/healthz` answers from the event loop
itself, so a reply means the loop is not blocked; it never looks at the database, because
restarting a worker does not bring a database back. `/readyz` says whether this worker can
do its job right now (database reachable, provider healthy) and, when not, why, in one line
of plain text that never holds a password; the lines after it say how the worker runs (for
example whether secrets are encrypted), ready or not.

`/metrics` is rendered off the event loop, which the sends share: on a thread of its own,
one render at a time, and every scrape that arrives while one runs gets that render's
answer. At most `MAX_WAITING_SCRAPES` wait for it; the others are answered 503 at once, so a
flood of scrapes costs the worker one render at a time and never delays `/healthz`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from leasebox.errors import ConfigurationError
from leasebox.runtime.metrics import WorkerMetrics

log = logging.getLogger("leasebox.health")

ReadinessCheck = Callable[[], Awaitable[str | None]]
# Scrapes that may wait for a render at once (Prometheus scrapes a target one at a time).
MAX_WAITING_SCRAPES = 8


class Exposition:
    """The registry's text, rendered on a thread of its own, one render at a time, shared by
    the scrapes that arrive while it runs; None for a scrape beyond `MAX_WAITING_SCRAPES`."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="leasebox-metrics")
        self._render: asyncio.Future[bytes] | None = None
        self._waiting = 0

    async def text(self) -> bytes | None:
        if self._waiting >= MAX_WAITING_SCRAPES:
            return None
        if self._render is None:
            loop = asyncio.get_running_loop()
            render = loop.run_in_executor(self._thread, self._metrics.exposition)
            render.add_done_callback(self._rendered)
            self._render = render
        self._waiting += 1
        try:
            return await asyncio.shield(self._render)
        finally:
            self._waiting -= 1

    def _rendered(self, _: asyncio.Future[bytes]) -> None:
        self._render = None

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def build_app(
    metrics: WorkerMetrics,
    readiness: ReadinessCheck,
    liveness: Callable[[], str | None] = lambda: None,
    details: Callable[[], list[str]] = list,
) -> web.Application:
    """The three routes; `readiness()` and `liveness()` return None or a reason, and
    `details()` the lines `/readyz` adds under its verdict."""

    exposition = Exposition(metrics)

    async def metrics_route(_: web.Request) -> web.Response:
        body = await exposition.text()
        if body is None:
            return web.Response(status=503, text="too many scrapes at once; try again\n")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stop_rendering(_: web.Application) -> None:
        exposition.close()

    async def healthz(_: web.Request) -> web.Response:
        problem = liveness()
        if problem:
            return web.Response(status=503, text=f"unhealthy: {problem}\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        try:
            problem = await readiness()
        except Exception as exc:  # a failing check is an answer, not a crash
            problem = f"readiness check failed ({type(exc).__name__})"
        extra = "".join(f"{line}\n" for line in details())
        if problem:
            return web.Response(status=503, text=f"not ready: {problem}\n{extra}")
        return web.Response(text=f"ready\n{extra}")

    app = web.Application()
    app.router.add_get("/metrics", metrics_route)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.on_cleanup.append(stop_rendering)
    return app


class HealthServer:
    """Serves `build_app` on `host:port` until `stop()`; port 0 picks a free port."""

    def __init__(self, app: web.Application, host: str = "0.0.0.0", port: int = 0) -> None:  # noqa: S104
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        self._host = host
        self._port = port
        self.port: int | None = None

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigurationError(
                f"cannot serve metrics on port {self._port}: {exc.strerror or exc}"
            ) from None
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port
        log.info("serving /metrics, /healthz and /readyz", extra={"port": self.port})

    async def stop(self) -> None:
        await self._runner.cleanup()
