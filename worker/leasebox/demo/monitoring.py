"""The demo's alerts: a real Prometheus with the chart's rules, scraping workers and operator.

The demo's control loop exports the operator's own pool metrics (the operator's metric
code, handed in by the command), every worker serves its `/metrics`, and a Prometheus
process (Debian's `prometheus` package, the one `make tools` installs for promtool) scrapes
them every second, workers found through a file it watches, labelled with the namespace and
pool a PodMonitor would give them. It evaluates the chart's rules file with its expressions
unchanged; only each rule's `for` is shortened, since the demo plays an incident in a
minute. `AlertWatch` reads Prometheus's HTTP API every second and notes when each alert
fired and when it cleared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from leasebox.store.backlog import Backlog
from leasebox.testing.ports import free_port

if TYPE_CHECKING:
    from leasebox.demo.run import DemoSettings

NAMESPACE = "demo"
POOL = "otp"
SHORT_FOR = "5s"
_FOR = re.compile(r"^(\s+for:\s*)\S+\s*$", re.MULTILINE)


class PoolMetrics(Protocol):
    """What the demo needs of the operator's metrics (`leasebox_operator.metrics`)."""

    def observe_spec(
        self,
        namespace: str,
        pool: str,
        *,
        sla: float,
        min_replicas: int,
        max_replicas: int,
        paused: bool,
    ) -> None: ...

    def observe_backlog(
        self, namespace: str, pool: str, backlog: Backlog, *, arrived: float
    ) -> None: ...

    def observe_replicas(
        self, namespace: str, pool: str, *, replicas: int, ready: int, desired: int
    ) -> None: ...

    def serve(self, port: int, host: str = ...) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Observatory:
    """What the demo needs to show its alerts: the binary, the rules, the operator's metrics."""

    prometheus: str
    rules: str
    metrics: PoolMetrics = field(repr=False)
    port: int = field(default_factory=free_port)
    operator_port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class AlertSpan:
    """One alert's firing, in seconds from the start of the traffic."""

    name: str
    severity: str
    fired_at: float
    cleared_at: float | None = None


def find_prometheus() -> str | None:
    return shutil.which("prometheus")


def demo_rules(rules: str) -> str:
    """The rules file with every `for` shortened to `SHORT_FOR`, the rest untouched."""
    return _FOR.sub(lambda m: f"{m.group(1)}{SHORT_FOR}", rules)


class Prometheus:
    """A Prometheus process scraping the operator and the workers of the demo."""

    def __init__(self, observatory: Observatory, folder: Path) -> None:
        self.observatory = observatory
        # Prometheus reads the paths of its configuration relative to the configuration.
        self.folder = folder.absolute()
        self.process: asyncio.subprocess.Process | None = None
        self._targets: list[int] | None = None

    async def start(self, log_dir: Path) -> None:
        await asyncio.to_thread(self._write_files, log_dir)
        log = (log_dir / "prometheus.log").open("ab")
        self.process = await asyncio.create_subprocess_exec(
            self.observatory.prometheus,
            f"--config.file={self.folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.observatory.port}",
            "--log.level=warn",
            stdout=log,
            stderr=log,
        )
        log.close()

    def _write_files(self, log_dir: Path) -> None:
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        (folder / "rules.yaml").write_text(demo_rules(self.observatory.rules))
        self.workers([])
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(folder / "rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": "leasebox-operator",
                    "honor_labels": True,
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{self.observatory.operator_port}"]}
                    ],
                },
                {
                    "job_name": "leasebox-worker",
                    "file_sd_configs": [
                        {"files": [str(folder / "workers.json")], "refresh_interval": "1s"}
                    ],
                },
            ],
        }
        # JSON is YAML: the configuration needs no YAML writer.
        (folder / "prometheus.yml").write_text(json.dumps(config, indent=2))

    async def wait_ready(self, session: aiohttp.ClientSession, within: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while asyncio.get_running_loop().time() < deadline:
            if self.process is not None and self.process.returncode is not None:
                raise RuntimeError(
                    f"prometheus exited with status {self.process.returncode}; see "
                    "prometheus.log in the demo's logs"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{self.observatory.url}/-/ready") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"prometheus did not become ready within {within:g}s")

    def workers(self, ports: list[int]) -> None:
        """Point the worker job at these metrics ports (written only when they change)."""
        ports = sorted(ports)
        if ports == self._targets:
            return
        groups = [
            {
                "targets": [f"127.0.0.1:{port}" for port in ports],
                "labels": {"namespace": NAMESPACE, "pool": POOL},
            }
        ]
        staged = self.folder / "workers.json.tmp"
        staged.write_text(json.dumps(groups))
        staged.replace(self.folder / "workers.json")
        self._targets = ports

    async def firing(self, session: aiohttp.ClientSession) -> dict[str, str]:
        """The alerts firing now, by name, with their severity."""
        async with session.get(f"{self.observatory.url}/api/v1/alerts") as response:
            body: dict[str, Any] = await response.json()
        return {
            str(alert["labels"]["alertname"]): str(alert["labels"].get("severity", ""))
            for alert in body["data"]["alerts"]
            if alert.get("state") == "firing"
        }

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


class AlertWatch:
    """When each alert fired and cleared, from Prometheus's API once a second."""

    def __init__(self, prometheus: Prometheus) -> None:
        self.prometheus = prometheus
        self.spans: list[AlertSpan] = []
        self._open: dict[str, AlertSpan] = {}

    async def look(self, session: aiohttp.ClientSession, now: float) -> None:
        try:
            firing = await self.prometheus.firing(session)
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            return  # a missed look is caught up by the next one
        for name, severity in firing.items():
            if name not in self._open:
                self._open[name] = AlertSpan(name, severity, round(now, 1))
        for name in [n for n in self._open if n not in firing]:
            span = self._open.pop(name)
            self.spans.append(AlertSpan(span.name, span.severity, span.fired_at, round(now, 1)))

    @property
    def firing_now(self) -> list[str]:
        return sorted(self._open)

    def all(self) -> tuple[AlertSpan, ...]:
        """Every firing so far, by the time it fired; those still firing have no clearing."""
        return tuple(sorted([*self.spans, *self._open.values()], key=lambda s: s.fired_at))


class Alerting:
    """One run's Prometheus, the operator's metrics it scrapes, and the watch on its alerts."""

    def __init__(self, observatory: Observatory, settings: DemoSettings) -> None:
        self.observatory = observatory
        self.settings = settings
        self.prometheus = Prometheus(observatory, settings.data_dir / "prometheus")
        self.watch = AlertWatch(self.prometheus)
        self.described = (
            f"Prometheus with the chart's rules file, every `for` shortened to {SHORT_FOR}"
        )

    @property
    def url(self) -> str:
        return self.observatory.url

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Export the pool's spec, serve the operator's metrics, start Prometheus on them."""
        metrics, settings = self.observatory.metrics, self.settings
        metrics.observe_spec(
            NAMESPACE,
            POOL,
            sla=settings.sla_seconds,
            min_replicas=settings.min_workers,
            max_replicas=settings.max_workers,
            paused=False,
        )
        metrics.serve(self.observatory.operator_port, "127.0.0.1")
        await self.prometheus.start(settings.data_dir / "logs")
        await self.prometheus.wait_ready(session)

    def export(
        self,
        backlog: Backlog,
        *,
        arrived: float,
        replicas: int,
        ready: int,
        desired: int,
        worker_ports: list[int],
    ) -> None:
        """One poll's figures, as the operator exports them, and the workers to scrape."""
        metrics = self.observatory.metrics
        metrics.observe_backlog(NAMESPACE, POOL, backlog, arrived=arrived)
        metrics.observe_replicas(NAMESPACE, POOL, replicas=replicas, ready=ready, desired=desired)
        self.prometheus.workers(worker_ports)

    async def wait_for_sla_alerts(self, within: float) -> None:
        """After the drain: give the SLA alerts their time to clear (bounded)."""
        deadline = asyncio.get_running_loop().time() + within
        while asyncio.get_running_loop().time() < deadline:
            if not [name for name in self.watch.firing_now if "SLA" in name]:
                return
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        await self.prometheus.stop()
        self.observatory.metrics.close()
