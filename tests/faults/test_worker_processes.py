"""Real `leasebox worker` processes against the hostile HTTP API: the reported failure (ids
with NUL bytes stopped the worker, and every restart sent its batch again) and a crash,
the one fault that may cause a duplicate, bounded by what the dead worker held."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from leasebox.producer.payload_crypto import PayloadCipher, generate_key
from leasebox.testing.ports import free_port
from support import hostile_http as http
from support.fault_rig import Printed, judge, rows, seed
from support.waiting import wait_for

pytestmark = pytest.mark.slow


class WorkerProcesses:
    def __init__(self, dsn: str, key: str, directory: Path) -> None:
        self.dsn, self.key, self.directory = dsn, key, directory
        self.started: list[tuple[subprocess.Popen[bytes], int, Path]] = []

    def start(self, provider: str, *args: str) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        log = self.directory / f"w{len(self.started) + 1}.log"
        command = [
            sys.executable, "-m", "leasebox", "worker", "--provider", provider,
            "--worker-id", f"w{len(self.started) + 1}", "--metrics-host", "127.0.0.1",
            "--metrics-port", str(port), "--kinds", "otp", "--poll-interval", "0.1",
            "--backoff-base", "0.05", "--backoff-max", "0.2", "--log-format", "json",
            "--log-level", "debug", *args,
        ]  # fmt: skip
        environment = {**os.environ, "LEASEBOX_DSN": self.dsn, "LEASEBOX_PAYLOAD_KEYS": self.key}
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=environment
            )
        self.started.append((process, port, log))
        return process, port

    def printed(self) -> str:
        return "\n".join(log.read_text(errors="replace") for _, _, log in self.started)

    def kill_all(self) -> None:
        for process, _, _ in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


@pytest.fixture
def key() -> str:
    return generate_key()


@pytest.fixture
def workers(db_dsn: str, key: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    rig = WorkerProcesses(db_dsn, key, tmp_path)
    try:
        yield rig
    finally:
        rig.kill_all()


def get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=10) as response:
        return int(response.status), str(response.read().decode())


def final(conn: psycopg.Connection[Any]) -> bool:
    return all(r["status"] in ("sent", "dead") for r in rows(conn).values())


def test_ids_with_nul_bytes_stop_no_worker_and_each_message_is_accepted_once(
    db_conn: psycopg.Connection[Any], workers: WorkerProcesses, key: str
) -> None:
    kinds = (http.NUL_ID, http.SURROGATE_ID, http.HUGE_ID, http.OK)
    seeded = seed(db_conn, PayloadCipher([key]), 20)
    chosen = {k: kinds[i % len(kinds)] for i, k in enumerate(seeded.keys)}
    with http.hostile_http(http.Script(reply=lambda k, nth: chosen[k])) as server:
        process, port = workers.start(server.url(), "--concurrency", "8")
        wait_for(lambda: final(db_conn), what=lambda: workers.printed()[-2000:], timeout=60)
        assert process.poll() is None, "the worker died"
        answers = [get(port, "healthz"), get(port, "readyz")]
        metrics = get(port, "metrics")[1]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, workers.printed()[-3000:]
        evidence = Printed("\n".join([workers.printed(), metrics, *(a[1] for a in answers)]))
        judge("process, http: NUL, surrogate, 1 MB ids", db_conn, seeded, server.copies, evidence)
        assert server.taken_count() == 20  # was 34 acceptances for 20 messages
    assert answers[0] == (200, "ok\n")
    assert answers[1][0] == 200
    assert {r["status"] for r in rows(db_conn).values()} == {"sent"}
    assert 'leasebox_sent_total{kind="otp"} 20.0' in metrics


def test_a_worker_killed_mid_batch_causes_duplicates_only_of_what_it_held(
    db_conn: psycopg.Connection[Any], workers: WorkerProcesses, key: str
) -> None:
    seeded = seed(db_conn, PayloadCipher([key]), 20)
    script = http.Script(reply=lambda k, nth: http.SLOW_OK, slow_seconds=0.5)
    with http.hostile_http(script) as server:
        first, _ = workers.start(server.url(), "--concurrency", "4", "--lease-seconds", "3")
        wait_for(lambda: server.taken_count() >= 6, what=workers.printed, timeout=60)
        # Frozen first, so that it claims nothing between the count and the kill.
        first.send_signal(signal.SIGSTOP)
        held = {
            k
            for k, r in rows(db_conn).items()
            if r["status"] == "processing" and r["leased_by"] == "w1"
        }
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second, _ = workers.start(server.url(), "--concurrency", "4", "--lease-seconds", "3")
        wait_for(lambda: final(db_conn), what=lambda: workers.printed()[-2000:], timeout=60)
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
        judge(
            "process, http: SIGKILL mid-batch",
            db_conn,
            seeded,
            server.copies,
            Printed(workers.printed()),
            duplicates=True,
        )
        doubled = {k for k in seeded.keys if len(server.taken(k)) > 1}
    assert doubled <= held, "a message the killed worker did not hold was sent twice"
    assert all(len(server.taken(k)) <= 2 for k in seeded.keys)
    assert {r["status"] for r in rows(db_conn).values()} == {"sent"}
