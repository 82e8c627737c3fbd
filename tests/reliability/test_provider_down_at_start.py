"""A worker whose mail provider is down when it starts waits for it, not ready, claiming nothing.

A pod whose worker exited 1 at every start crash-looped through a provider's blip. Now the
worker starts, answers `/healthz`, says on `/readyz` and in `leasebox_not_ready` why it is not
ready, keeps trying with a growing pause, and claims nothing until the provider answers; a
configuration the worker refuses (a provider URL it cannot use) still ends it at once.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import psycopg
import pytest

from leasebox.testing.ports import free_port
from support.reliability_rig import SmtpServer, Workers, seed, statuses
from support.waiting import wait_for

pytestmark = pytest.mark.slow
NOT_READY = 'leasebox_not_ready{cause="provider_start"}'


def attempts(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(attempts), 0) FROM leasebox.queue").fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_started_while_the_provider_is_down_waits_not_ready_and_sends_once_it_is_up(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    smtp_server.stop()  # the mail service has a blip as the pod starts
    seed(db_dsn, 5)
    worker = worker_processes.start()
    worker_processes.wait_answering(worker)  # alive: /healthz answers

    def not_ready_for_the_provider() -> bool:
        status, text = worker.readiness()
        return status == 503 and "provider" in text

    wait_for(not_ready_for_the_provider, what=worker.log, timeout=30)
    assert worker.metric(NOT_READY) == 1.0
    assert "cannot start the smtp provider" in worker.readiness()[1]
    assert statuses(db_dsn) == {"pending": 5}
    assert attempts(db_dsn) == 0  # claimed nothing

    smtp_server.start()
    wait_for(lambda: statuses(db_dsn) == {"sent": 5}, what=worker.log, timeout=60)
    assert worker.readiness()[0] == 200
    assert worker.metric(NOT_READY) == 0.0
    assert smtp_server.sink.delivered == 5
    worker_processes.stop_all()
    assert "waiting for the provider" in worker.log()


def test_a_worker_waiting_for_its_provider_stops_at_once_on_sigterm(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    smtp_server.stop()
    worker = worker_processes.start()
    worker_processes.wait_answering(worker)
    wait_for(lambda: worker.readiness()[0] == 503, what=worker.log, timeout=30)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=10) == 0


def test_a_provider_url_the_worker_refuses_still_ends_it_at_once_with_2(db_dsn: str) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "leasebox", "worker", "--dsn", db_dsn),
            *("--provider", "smtp://127.0.0.1:not-a-port", "--metrics-port", str(free_port())),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
