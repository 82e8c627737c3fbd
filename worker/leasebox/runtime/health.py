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

Three GET routes do not need a web framework, and importing one (with its HTTP client, its
TLS contexts and its URL machinery) was a quarter of every worker's start-up, paid by each
pod a scale-up adds. The server here speaks just enough HTTP/1.1 for probes and scrapes
(`leasebox.runtime.probe_http`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST

from leasebox.errors import ConfigurationError
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.runtime.probe_http import Answer, ProbeHttpServer, Route

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


@dataclass(frozen=True)
class HealthApp:
    """The three routes, by path, and what to release when the server stops."""

    routes: Mapping[str, Route]
    close: Callable[[], None]


def build_app(
    metrics: WorkerMetrics,
    readiness: ReadinessCheck,
    liveness: Callable[[], str | None] = lambda: None,
    details: Callable[[], list[str]] = list,
) -> HealthApp:
    """The three routes; `readiness()` and `liveness()` return None or a reason, and
    `details()` the lines `/readyz` adds under its verdict."""

    exposition = Exposition(metrics)

    async def metrics_route() -> Answer:
        body = await exposition.text()
        if body is None:
            return Answer(503, b"too many scrapes at once; try again\n")
        return Answer(200, body, CONTENT_TYPE_LATEST)

    async def healthz() -> Answer:
        problem = liveness()
        if problem:
            return Answer.text(503, f"unhealthy: {problem}\n")
        return Answer.text(200, "ok\n")

    async def readyz() -> Answer:
        try:
            problem = await readiness()
        except Exception as exc:  # a failing check is an answer, not a crash
            problem = f"readiness check failed ({type(exc).__name__})"
        extra = "".join(f"{line}\n" for line in details())
        if problem:
            return Answer.text(503, f"not ready: {problem}\n{extra}")
        return Answer.text(200, f"ready\n{extra}")

    routes = {"/metrics": metrics_route, "/healthz": healthz, "/readyz": readyz}
    return HealthApp(routes, exposition.close)


class HealthServer:
    """Serves `build_app` on `host:port` until `stop()`; port 0 picks a free port."""

    def __init__(self, app: HealthApp, host: str = "0.0.0.0", port: int = 0) -> None:  # noqa: S104
        self._app = app
        self._server = ProbeHttpServer(app.routes)
        self._host = host
        self._port = port
        self.port: int | None = None

    async def start(self) -> None:
        try:
            self.port = await self._server.start(self._host, self._port)
        except OSError as exc:
            self._app.close()
            raise ConfigurationError(
                f"cannot serve metrics on port {self._port}: {exc.strerror or exc}"
            ) from None
        log.info("serving /metrics, /healthz and /readyz", extra={"port": self.port})

    async def stop(self) -> None:
        try:
            await self._server.stop()
        finally:
            self._app.close()
