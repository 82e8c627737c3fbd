"""The demo's worker pool: real `leasebox worker` processes, run the way a Deployment runs pods.

Workers are subprocesses, not tasks, for two reasons the demo is about: one can be killed with
SIGKILL in the middle of a send (nothing in it gets to clean up, exactly like a pod that is
OOM-killed), and start-up costs real time (an interpreter, imports, a database pool), which
the scaling policy must count as capacity on its way. Like a Deployment, the pool replaces a
worker that died, stops the newest workers first on a scale-down (SIGTERM: they finish their
sends and release their leases), and counts a worker ready when its `/readyz` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from leasebox.testing.ports import free_port

COUNTERS = {
    "leasebox_sent_total": "sent",
    "leasebox_retries_total": "retries",
    "leasebox_lease_lost_total": "lease_lost",
    "leasebox_dead_letters_total": "dead_letters",
    "leasebox_leases_reclaimed_total": "reclaimed",
}


@dataclass(frozen=True)
class WorkerOptions:
    """How every worker of the pool is started (the pod template)."""

    dsn: str
    provider_url: str
    log_dir: Path
    schema: str = "leasebox"
    kinds: str = "otp"
    concurrency: int = 8
    lease_seconds: float = 6.0
    poll_interval: float = 0.5
    backoff_base: float = 1.0
    backoff_max: float = 4.0
    grace_seconds: float = 5.0
    environment: dict[str, str] = field(default_factory=dict, repr=False)

    def command(self, worker_id: str, metrics_port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "leasebox",
            "worker",
            "--dsn",
            self.dsn,
            "--schema",
            self.schema,
            "--kinds",
            self.kinds,
            "--provider",
            self.provider_url,
            "--concurrency",
            str(self.concurrency),
            "--lease-seconds",
            str(self.lease_seconds),
            "--poll-interval",
            str(self.poll_interval),
            "--backoff-base",
            str(self.backoff_base),
            "--backoff-max",
            str(self.backoff_max),
            "--grace",
            str(self.grace_seconds),
            "--metrics-port",
            str(metrics_port),
            "--metrics-host",
            "127.0.0.1",
            "--log-format",
            "json",
            "--worker-id",
            worker_id,
        ]


@dataclass
class WorkerProcess:
    worker_id: str
    process: asyncio.subprocess.Process
    metrics_port: int
    log: IO[bytes]
    started_at: float
    ready_at: float | None = None
    stopping: bool = False
    killed: bool = False
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None


class WorkerPool:
    """Keeps `desired` worker processes running; reports readiness and summed counters."""

    def __init__(self, options: WorkerOptions, session: aiohttp.ClientSession) -> None:
        self.options = options
        self.desired = 0
        self._session = session
        self._workers: list[WorkerProcess] = []
        self._retired: list[WorkerProcess] = []
        self._next = 1
        self._killed = 0
        self._replaced = 0
        self.startup_seconds: list[float] = []

    @property
    def replicas(self) -> int:
        """Workers counted toward `desired`: running or starting, not stopping."""
        return sum(1 for w in self._workers if w.alive and not w.stopping)

    @property
    def ready_replicas(self) -> int:
        return sum(1 for w in self._workers if w.alive and not w.stopping and w.ready_at)

    def metrics_ports(self) -> list[int]:
        return [w.metrics_port for w in self._workers if w.alive and not w.stopping]

    def running_ids(self, ready_for: float | None = None) -> list[str]:
        """Workers not stopping; with `ready_for`, only those ready at least that long."""
        now = time.monotonic()
        return [
            w.worker_id
            for w in self._workers
            if w.alive
            and not w.stopping
            and (ready_for is None or (w.ready_at is not None and now - w.ready_at >= ready_for))
        ]

    async def scale_to(self, replicas: int) -> None:
        self.desired = replicas
        await self.reconcile()

    async def reconcile(self) -> list[str]:
        """Reap, replace, stop surplus workers, probe readiness, scrape counters.

        Returns one line per noteworthy event (a worker died or became ready).
        """
        events: list[str] = []
        for worker in list(self._workers):
            if not worker.alive:
                self._workers.remove(worker)
                self._retired.append(worker)
                worker.log.close()
                if not worker.stopping and not worker.killed:
                    events.append(
                        f"{worker.worker_id} exited with code {worker.process.returncode}"
                    )
        active = [w for w in self._workers if not w.stopping]
        for worker in reversed(active[self.desired :]):
            await self._scrape(worker)
            worker.stopping = True
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        for _ in range(self.desired - len(active)):
            await self._spawn()
            if self._replaced < self._killed:
                self._replaced += 1
                events.append(f"{self._workers[-1].worker_id} started in place of a killed worker")
        for worker in self._workers:
            if worker.stopping or not worker.alive:
                continue
            if worker.ready_at is None and await self._probe(worker):
                worker.ready_at = time.monotonic()
                self.startup_seconds.append(worker.ready_at - worker.started_at)
                events.append(
                    f"{worker.worker_id} ready after {worker.ready_at - worker.started_at:.1f}s"
                )
            if worker.ready_at is not None:
                await self._scrape(worker)
        return events

    async def kill(self, worker_id: str) -> bool:
        """SIGKILL one worker: no shutdown, no lease release, sends cut off mid-flight."""
        for worker in self._workers:
            if worker.worker_id == worker_id and worker.alive:
                await self._scrape(worker)
                worker.killed = True
                self._killed += 1
                worker.process.kill()
                await worker.process.wait()
                return True
        return False

    def totals(self) -> dict[str, float]:
        """Counters summed over every worker this pool ever ran (last scrape of each)."""
        sums = dict.fromkeys(COUNTERS.values(), 0.0)
        for worker in [*self._workers, *self._retired]:
            for name, value in worker.counters.items():
                sums[name] += value
        return sums

    async def close(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after the grace) and wait for them."""
        self.desired = 0
        for worker in self._workers:
            if worker.alive:
                if worker.ready_at is not None:
                    await self._scrape(worker)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
        deadline = self.options.grace_seconds + 5
        for worker in self._workers:
            try:
                await asyncio.wait_for(worker.process.wait(), deadline)
            except TimeoutError:
                worker.process.kill()
                await worker.process.wait()
            worker.log.close()
        self._retired += self._workers
        self._workers = []

    async def _spawn(self) -> None:
        worker_id = f"demo-worker-{self._next}"
        self._next += 1
        port = free_port()
        self.options.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.options.log_dir / f"{worker_id}.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            *self.options.command(worker_id, port),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self.options.environment},
        )
        self._workers.append(WorkerProcess(worker_id, process, port, log, time.monotonic()))

    async def _get(self, worker: WorkerProcess, path: str) -> str | None:
        url = f"http://127.0.0.1:{worker.metrics_port}{path}"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as reply:
                return await reply.text() if reply.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def _probe(self, worker: WorkerProcess) -> bool:
        return await self._get(worker, "/readyz") is not None

    async def _scrape(self, worker: WorkerProcess) -> None:
        text = await self._get(worker, "/metrics")
        if text is None:
            return
        counters = dict.fromkeys(COUNTERS.values(), 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = COUNTERS.get(sample.name)
                if name is not None:
                    counters[name] += sample.value
        worker.counters = counters
