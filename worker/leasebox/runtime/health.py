"""The worker's HTTP side: `/metrics` for Prometheus, `/healthz` and `/readyz` for Kubernetes.

Liveness and readiness answer different questions. `/healthz` answers from the event loop
itself, so a reply means the loop is not blocked; it never looks at the database, because
restarting a worker does not bring a database back. `/readyz` says whether this worker can
do its job right now (database reachable, provider healthy) and, when not, why, in one line
of plain text that never holds a password; the lines after it say how the worker runs (for
example whether secrets are encrypted), ready or not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from leasebox.errors import ConfigurationError
from leasebox.runtime.metrics import WorkerMetrics

log = logging.getLogger("leasebox.health")

ReadinessCheck = Callable[[], Awaitable[str | None]]


def build_app(
    metrics: WorkerMetrics,
    readiness: ReadinessCheck,
    liveness: Callable[[], str | None] = lambda: None,
    details: Callable[[], list[str]] = list,
) -> web.Application:
    """The three routes; `readiness()` and `liveness()` return None or a reason, and
    `details()` the lines `/readyz` adds under its verdict."""

    async def metrics_route(_: web.Request) -> web.Response:
        body = metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

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
