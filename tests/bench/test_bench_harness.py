"""The benchmark's measuring parts, each checked on its own: server URLs that keep their
database (a Unix socket included), CPU time taken from the worker process itself, delivery
keys counted exactly once, profiles summarised without start-up, and a run that reports
failures without mistaking a missing feature for one."""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from bench.accounting import per_message_micros
from bench.drain import run_processes
from bench.pgserver import as_url, with_dbname
from bench.profile_drain import area_of, module_of, summarise_collapsed
from bench.providers import keys_accounting
from bench.run import failures, parse_args
from psycopg import conninfo


def test_a_unix_socket_server_url_keeps_its_database_name() -> None:
    url = as_url(with_dbname("postgresql://bench@/postgres?host=/var/run/postgresql", "b_1"))

    params = conninfo.conninfo_to_dict(url)

    assert (params["dbname"], params["host"], params["user"]) == (
        "b_1",
        "/var/run/postgresql",
        "bench",
    )


def test_a_tcp_server_url_keeps_host_port_password_and_database() -> None:
    url = as_url("host=127.0.0.1 port=5433 user=u password=p@ss dbname=d")

    params = conninfo.conninfo_to_dict(url)

    assert (params["host"], params["port"], params["password"], params["dbname"]) == (
        "127.0.0.1",
        "5433",
        "p@ss",
        "d",
    )


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_worker_cpu_is_the_processes_own_cpu_time(tmp_path: Path) -> None:
    burn = """
        import time
        while time.process_time() < 0.3:
            pass
    """
    logs = [tmp_path / "a.log", tmp_path / "b.log"]

    _, cpu, error = run_processes([_python(burn), _python(burn)], logs, timeout=120)

    assert error == ""
    assert cpu >= 0.6  # each child spent at least 0.3 s of its own CPU


def test_a_worker_that_fails_is_reported_with_its_exit_status_and_output(tmp_path: Path) -> None:
    failing = "import sys; print('no database'); sys.exit(3)"

    _, _, error = run_processes([_python(failing)], [tmp_path / "a.log"], timeout=120)

    assert error.startswith("worker exited 3")
    assert "no database" in error


def test_a_worker_past_its_deadline_is_killed_and_reported(tmp_path: Path) -> None:
    hang = "import time; time.sleep(600)"

    _, _, error = run_processes([_python(hang)], [tmp_path / "a.log"], timeout=0.5)

    assert error.startswith("timed out")


def test_cpu_per_message_takes_out_the_empty_queue_run() -> None:
    assert per_message_micros(1.5, 0.5, 100_000) == pytest.approx(10.0)
    assert per_message_micros(0.4, 0.5, 1000) == 0.0
    assert per_message_micros(1.0, 0.0, 0) is None


def test_keys_accounting_catches_a_duplicate_and_a_stranger() -> None:
    counts = Counter({"otp:bench:0": 1, "otp:bench:1": 2, "otp:other:7": 1})

    found = keys_accounting(3, counts, "otp:bench:")

    assert (found.missing, found.duplicates, found.unexpected) == (1, 1, 1)
    assert not found.exactly_once


def test_keys_accounting_accepts_every_key_once() -> None:
    counts = Counter({f"otp:bench:{i}": 1 for i in range(5)})

    assert keys_accounting(5, counts, "otp:bench:").exactly_once


def test_profile_frames_name_their_module_and_package() -> None:
    assert module_of("leasebox/runtime/worker.py") == "leasebox.runtime.worker"
    assert module_of("/x/lib/python3.11/site-packages/psycopg/cursor.py") == "psycopg.cursor"
    assert module_of("/usr/lib/python3.11/asyncio/events.py") == "asyncio.events"
    assert module_of("<string>") == "generated"
    assert area_of("leasebox.store.claiming") == "leasebox.store"
    assert area_of("prometheus_client.values") == "prometheus_client"


def test_a_profile_summary_leaves_start_up_out_of_the_shares() -> None:
    raw = "\n".join(
        [
            "<module> (leasebox);_find_and_load (<frozen importlib._bootstrap>) 50",
            "run (leasebox/runtime/worker.py);execute (psycopg/cursor.py) 30",
            "run (leasebox/runtime/worker.py);inc (prometheus_client/values.py) 10",
            "run (leasebox/runtime/worker.py) 10",
        ]
    )

    found = summarise_collapsed(raw)

    assert (found.samples, found.start_up) == (100, 50)
    assert dict(found.by_package) == {
        "psycopg": 60.0,
        "prometheus_client": 20.0,
        "leasebox.runtime": 20.0,
    }
    assert dict(found.inclusive) == {"leasebox.runtime.worker.run": 100.0}


def test_bench_quick_in_the_environment_selects_quick_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BENCH_QUICK", "1")
    assert parse_args([]).quick is True
    monkeypatch.setenv("BENCH_QUICK", "0")
    assert parse_args([]).quick is False


def test_a_run_fails_on_a_broken_measurement_but_not_on_a_missing_feature() -> None:
    results = {
        "drain": [{"system": "leasebox", "rows": 10, "processes": 1, "ok": True, "error": ""}],
        "history": {"errors": ["drain: worker exited 1"]},
        "providers": {"http": {"bare": {"ok": True}, "worker": {"ok": False, "error": ""}}},
        "enqueue": [{"method": "m", "mode": "batch", "error": "missing: no enqueue_many"}],
    }

    assert failures(results) == [
        "history: drain: worker exited 1",
        "provider http worker: not exactly-once",
    ]


def test_an_enqueue_case_keeps_its_fastest_round_and_a_failed_round_voids_it() -> None:
    from bench.enqueue_rate import EnqueueResult, best_of_rounds

    first = [EnqueueResult("a", "one", 100, 2.0), EnqueueResult("b", "one", 100, 1.0)]
    second = [EnqueueResult("a", "one", 100, 1.0), EnqueueResult("b", "one", 100, 0.5, "9 rows")]

    fast, failed = best_of_rounds([first, second])

    assert (fast.seconds, fast.round_rates) == (1.0, (50.0, 100.0))
    assert (failed.error, failed.round_rates) == ("9 rows", (100.0, 200.0))
