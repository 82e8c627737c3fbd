"""A real Prometheus scrapes a real worker and a real operator; every shipped query answers.

The worker sends through a loopback SMTP server that fails some sends and rejects one
address, so retries and dead letters exist; the operator polls a pool's backlog through
the emulated Kubernetes API. Prometheus scrapes both every second, labelling the worker
the way the chart's PodMonitor does. Then every alert expression and every dashboard
panel query is evaluated through Prometheus's HTTP API: each must parse and evaluate
without error, and each metric selector in it must return series. A misspelled metric or
label name fails here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from leasebox import OutboxMessage, enqueue
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from leasebox.testing.ports import free_port
from leasebox.testing.smtp_sink import SmtpSink
from monitoring_sources import alert_expressions, dashboard_expressions
from support.kube.emulator import KubeEmulator
from support.kube.harness import POOLS, running_operator
from support.waiting import wait_for

pytestmark = pytest.mark.slow
NAMESPACE, POOL_NAME = "default", "otp"
SELECTOR = re.compile(r"\b(leasebox_[a-z_]+)(\{[^}]*\})?")
VARIABLES = {"namespace": NAMESPACE, "pool": POOL_NAME, "__rate_interval": "1m"}


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is missing: install the Debian package prometheus")
        pytest.skip("prometheus is missing (Debian package prometheus)")
    return found


class Prometheus:
    """A Prometheus server on loopback with a given scrape configuration."""

    def __init__(self, workdir: Path, targets: dict[str, tuple[int, dict[str, str]]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": labels}],
                }
                for job, (port, labels) in targets.items()
            ],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.workdir = workdir

    def start(self) -> subprocess.Popen[bytes]:
        command = [
            prometheus_binary(), f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ]  # fmt: skip
        with (self.workdir / "prometheus.log").open("wb") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                payload: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                payload = json.loads(body)
            except ValueError:  # "Service Unavailable" while the server is starting
                payload = {"status": f"http {exc.code}", "error": body.decode(errors="replace")}
        except urllib.error.URLError as exc:
            payload = {"status": "unreachable", "error": str(exc.reason)}
        return payload

    def has_series(self, selector: str) -> bool:
        answer = self.query(selector)
        return answer.get("status") == "success" and bool(answer["data"]["result"])

    def targets_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=2) as response:
                active = json.loads(response.read())["data"]["activeTargets"]
        except OSError:
            return False
        return bool(active) and all(t["health"] == "up" for t in active)


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The codes enqueued here are test data for the metrics: they opt in to plaintext."""
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")


@pytest.fixture
def worker_metrics_port(db_dsn: str, tmp_path: Path) -> Iterator[int]:
    """A real worker draining a backlog with retries and a dead letter, metrics on a port."""
    sink = SmtpSink(rejected=["bounce@rejected.example"]).start()
    sink.failing = True
    recipients = [f"user{i}@example.com" for i in range(40)] + ["bounce@rejected.example"]
    with psycopg.connect(db_dsn) as conn:
        for i, recipient in enumerate(recipients):
            message = OutboxMessage(kind="otp", recipient=recipient, secrets={"code": f"{i:06}"})
            enqueue(conn, message)
    port = free_port()
    command = [
        sys.executable, "-m", "leasebox", "worker", "--dsn", db_dsn, "--kinds", "otp",
        "--provider", sink.url, "--metrics-port", str(port), "--poll-interval", "0.2",
        "--backoff-base", "0.2", "--backoff-max", "0.5", "--log-format", "json",
    ]  # fmt: skip
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: sink.transient_rejections > 0, what="a transient failure", timeout=30)
        sink.failing = False
        wait_for(lambda: len(sink.received) >= 40, what="the backlog delivered", timeout=30)
        yield port
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        sink.stop()


def test_every_alert_and_dashboard_query_answers_from_real_scrapes(
    worker_metrics_port: int, db_dsn: str, kube_emulator: KubeEmulator, tmp_path: Path
) -> None:
    with running_operator(kube_emulator, db_dsn, tmp_path) as operator_port:
        kube_emulator.create(*POOLS, {
            "apiVersion": "leasebox.dev/v1alpha1", "kind": "OutboxWorkerPool",
            "metadata": {"name": POOL_NAME, "namespace": NAMESPACE},
            "spec": {
                "kinds": ["otp"],
                "database": {"secretRef": {"name": "leasebox-database"}},
                "provider": {"secretRef": {"name": "leasebox-provider"}},
                "sla": {"oldestPendingAgeSeconds": 60},
                "scaling": {"minReplicas": 1, "maxReplicas": 4, "pollIntervalSeconds": 1},
            },
        }, namespace=NAMESPACE)  # fmt: skip
        prometheus = Prometheus(tmp_path, {
            "leasebox-worker": (worker_metrics_port, {"namespace": NAMESPACE, "pool": POOL_NAME}),
            "leasebox-operator": (operator_port, {}),
        })  # fmt: skip
        server = prometheus.start()
        try:
            wait_for(prometheus.targets_up, what="both scrape targets up", timeout=30)
            wait_for(lambda: prometheus.has_series("leasebox_pool_sla_seconds"),
                     what="operator series", timeout=30)  # fmt: skip
            wait_for(lambda: prometheus.has_series("leasebox_sent_total"),
                     what="worker series", timeout=30)  # fmt: skip
            with psycopg.connect(db_dsn) as conn:
                for i in range(20):
                    enqueue(conn, OutboxMessage(kind="otp", recipient=f"late{i}@example.com",
                                                secrets={"code": f"{i:06}"}))  # fmt: skip
            wait_for(lambda: prometheus.has_series("rate(leasebox_sent_total[1m]) > 0"),
                     what="a send rate", timeout=30)  # fmt: skip

            expressions = {
                **{f"alert {k}": v for k, v in alert_expressions().items()},
                **{f"panel {k}": v for k, v in dashboard_expressions(VARIABLES).items()},
            }
            # Every series appears once its process has had a reason to report it (the
            # operator its first decision for the pool): wait for all, then judge each.
            selectors = {m + labels for expr in expressions.values()
                         for m, labels in SELECTOR.findall(expr)}  # fmt: skip
            with contextlib.suppress(AssertionError):  # the assertion below names what lacks
                wait_for(lambda: all(prometheus.has_series(s) for s in selectors),
                         what="every series the queries select", timeout=60)  # fmt: skip
            failures: list[str] = []
            for name, expr in expressions.items():
                answer = prometheus.query(expr)
                if answer.get("status") != "success" or answer.get("warnings"):
                    failures.append(f"{name}: {answer.get('error') or answer.get('warnings')}")
                    continue
                for metric, labels in SELECTOR.findall(expr):
                    if not prometheus.has_series(metric + labels):
                        failures.append(f"{name}: no series for {metric + labels}")
        finally:
            server.terminate()
            server.wait(timeout=30)

    assert len(expressions) > 30
    assert failures == [], "\n".join(failures)


def test_a_misspelled_metric_is_caught_by_the_series_check(tmp_path: Path) -> None:
    prometheus = Prometheus(tmp_path, {})
    server = prometheus.start()
    try:
        wait_for(lambda: prometheus.query("vector(1)").get("status") == "success",
                 what="prometheus up", timeout=30)  # fmt: skip
        assert prometheus.query("leasebox_sent_totl").get("status") == "success"
        assert not prometheus.has_series("leasebox_sent_totl")
        assert prometheus.query("rate(leasebox_sent_total[1m]").get("status") == "error"
    finally:
        server.terminate()
        server.wait(timeout=30)
