"""A real Prometheus scrapes a real worker and the chart's operator; every shipped query answers.

The worker sends through a loopback SMTP server that fails some sends and rejects one
address, so retries and dead letters exist; the operator (the chart's, a pod of the test
node) polls a pool's backlog in the same database. Prometheus scrapes both every second,
labelling the worker the way the chart's PodMonitor does. Then every alert expression and
every dashboard panel query is evaluated through Prometheus's HTTP API: each must parse and
evaluate without error, and each metric selector in it must return series. A misspelled
metric or label name fails here. The pool's provider quota is far below the rate at which a
trickle of messages arrives, so the series that exist only while arrivals exceed a quota
exist too.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from leasebox import OutboxMessage, enqueue
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE
from leasebox.testing.ports import free_port
from leasebox.testing.smtp_sink import SmtpSink
from monitoring_sources import alert_expressions, dashboard_expressions
from support.cluster.kubelet import ProcessKubelet
from support.cluster.release import POOLS, pool_body, running_operator_pods, secret
from support.cluster.rest import Rest
from support.pace import wait_for
from support.prometheus import Prometheus

POOL_NAME = "otp"
RELEASE = "leasebox"
SELECTOR = re.compile(r"\b(leasebox_[a-z_]+)(\{[^}]*\})?")


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The codes enqueued here are test data for the metrics: they opt in to plaintext."""
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")


# One message a day: any arrival rate exceeds it.
QUOTA = {"messages": 1, "perSeconds": 86400}


def enqueue_otps(db_dsn: str, prefix: str, count: int) -> None:
    with psycopg.connect(db_dsn) as conn:
        for i in range(count):
            message = OutboxMessage(
                kind="otp", recipient=f"{prefix}{i}@example.com", secrets={"code": f"{i:06}"}
            )
            enqueue(conn, message)


@contextlib.contextmanager
def trickle(db_dsn: str) -> Iterator[None]:
    """Messages arriving all along, one every 0.2 s, so arrivals exceed the quota."""
    stop = threading.Event()

    def run() -> None:
        n = 0
        while not stop.wait(0.2):
            enqueue_otps(db_dsn, f"trickle{n}-", 1)
            n += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


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
        *(sys.executable, "-m", "leasebox", "worker", "--dsn", db_dsn, "--kinds", "otp"),
        *("--provider", sink.url, "--metrics-port", str(port), "--poll-interval", "0.2"),
        *("--backoff-base", "0.2", "--backoff-max", "0.5", "--log-format", "json"),
    ]
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
    release: str,
    kube: Rest,
    kubelet: ProcessKubelet,
    namespace: str,
    worker_metrics_port: int,
    db_dsn: str,
    tmp_path: Path,
) -> None:
    kube.create("v1", "secrets", secret("leasebox-database", "dsn", db_dsn, namespace), namespace)
    kube.create("v1", "secrets", secret("leasebox-provider", "url", "log://", namespace), namespace)
    scaling = {"minReplicas": 1, "maxReplicas": 4, "pollIntervalSeconds": 1}
    provider = {"secretRef": {"name": "leasebox-provider"}, "quota": QUOTA}
    sla = {"oldestPendingAgeSeconds": 60}
    pool = pool_body(POOL_NAME, namespace, scaling=scaling, sla=sla, provider=provider)
    kube.create(*POOLS, pool, namespace)
    (operator_pod, *_) = running_operator_pods(kube, kubelet, release, RELEASE)
    operator_port = kubelet.host_port(release, operator_pod, "http-metrics")
    prometheus = Prometheus(
        tmp_path,
        {
            "leasebox-worker": (worker_metrics_port, {"namespace": namespace, "pool": POOL_NAME}),
            "leasebox-operator": (operator_port, {}),
        },
    )
    variables = {"namespace": namespace, "pool": POOL_NAME, "__rate_interval": "1m"}
    server = prometheus.start()
    try:
        with trickle(db_dsn):
            wait_for(prometheus.targets_up, what="both scrape targets up", timeout=30)
            wait_for(
                lambda: prometheus.has_series(
                    f'leasebox_pool_sla_seconds{{namespace="{namespace}"}}'
                ),
                what="the pool's operator series",
                timeout=30,
            )
            wait_for(lambda: prometheus.has_series("leasebox_sent_total"), what="worker series")
            enqueue_otps(db_dsn, "late", 20)
            wait_for(
                lambda: prometheus.has_series("rate(leasebox_sent_total[1m]) > 0"),
                what="a send rate",
                timeout=30,
            )

            expressions = {
                **{f"alert {k}": v for k, v in alert_expressions().items()},
                **{f"panel {k}": v for k, v in dashboard_expressions(variables).items()},
            }
            # Every series appears once its process has had a reason to report it (the
            # operator its first decision for the pool): wait for all, then judge each.
            selectors = {
                m + labels for expr in expressions.values() for m, labels in SELECTOR.findall(expr)
            }
            with contextlib.suppress(AssertionError):  # the assertion below names what lacks
                wait_for(
                    lambda: all(prometheus.has_series(s) for s in selectors),
                    what="every series the queries select",
                    timeout=60,
                )
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
