"""The benchmark harness is tested like the rest: its accounting must catch a lost or doubled
message, and every benchmark, run tiny on a real PostgreSQL, must come out exactly-once with
its figures in place (never judged on speed: speed targets live in `bench/`)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from bench.accounting import account_ids, account_table, net_rate, percentile
from bench.drain import DrainResult, keep_better, run_drain
from bench.enqueue_rate import (
    LEASEBOX_MANY,
    LEASEBOX_MANY_STATEMENTS,
    LEASEBOX_STATEMENT,
    MANY,
    ONE,
    PLAIN_MANY,
    WRAPPED,
    batch_api,
    run_enqueue,
)
from bench.history import (
    prune_oldest_day,
    retention_error,
    run_history,
    seed_history,
    take_turns,
    take_turns_async,
)
from bench.otp_semantics import run_backlog_latency, run_quota
from bench.pgserver import BenchServer
from bench.plain_worker import product_statements, without_history
from bench.providers import run_http, run_smtp
from bench.systems import (
    LEASEBOX,
    PLAIN_LEASEBOX_SCHEMA,
    PLAIN_MINIMAL,
    STATEMENTS_WITH_HISTORY,
    STATEMENTS_WITHOUT_HISTORY,
    leasebox_system,
    plain_minimal_system,
    plain_system,
    seed_minimal,
    seed_outbox,
    statements_system,
    verify_minimal,
    verify_outbox,
)

import leasebox
from bench import enqueue_peers
from leasebox.db.queries import named_queries
from leasebox.testing.embedded import EmbeddedPostgres


def test_accounting_of_job_records_catches_a_lost_and_a_doubled_job() -> None:
    result = account_ids(5, [0, 1, 1, 3, 4])

    assert (result.processed, result.missing, result.duplicates) == (5, 1, 1)
    assert not result.exactly_once


def test_accounting_of_job_records_accepts_each_job_once_in_any_order() -> None:
    assert account_ids(4, [3, 0, 2, 1]).exactly_once


def test_accounting_flags_a_job_number_that_was_never_seeded() -> None:
    result = account_ids(2, [0, 1, 7])

    assert result.unexpected == 1
    assert not result.exactly_once


def test_table_accounting_counts_a_row_claimed_twice_as_a_duplicate() -> None:
    result = account_table(expected=3, total=3, sent_claimed_once=2, claimed_more=1)

    assert result.duplicates == 1
    assert not result.exactly_once


def test_net_rate_takes_out_start_up_but_never_more_than_half_the_run() -> None:
    assert net_rate(1000, 3.0, 1.0) == pytest.approx(500.0)
    assert net_rate(1000, 2.0, 1.9) == pytest.approx(1000.0)


def test_percentile_interpolates_between_neighbours() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)


def _drained(rate: float, error: str = "") -> DrainResult:
    accounting = account_ids(2, [0, 1])
    return DrainResult("leasebox", 2, 1, 1.0, 0.1, rate, rate, accounting, error)


def test_best_of_rounds_keeps_the_fastest_exactly_once_run_and_every_rate() -> None:
    best = None
    for result in (_drained(100.0), _drained(300.0, error="worker exited 1"), _drained(200.0)):
        best = keep_better(best, result)

    assert best is not None
    assert (best.rate, best.attempt_rates) == (200.0, (100.0, 300.0, 200.0))


def test_outbox_accounting_sees_a_row_that_was_claimed_twice(db_dsn: str) -> None:
    seed_outbox(db_dsn, 4)
    with psycopg.connect(db_dsn) as conn:
        # Every message sent, the first one at its second claim.
        conn.execute(
            "INSERT INTO leasebox.history (outbox_id, bucket, kind, event, at, attempt)"
            " SELECT id, bucket, kind, e.event, now(), e.attempt + (id = m.first)::int"
            " FROM leasebox.queue CROSS JOIN (SELECT min(id) AS first FROM leasebox.queue) AS m"
            " CROSS JOIN (VALUES ('claimed', 1), ('sent', 1)) AS e (event, attempt)"
        )
        conn.execute("DELETE FROM leasebox.queue")
        conn.commit()

    result = verify_outbox(db_dsn, 4, [])

    assert (result.processed, result.duplicates, result.exactly_once) == (4, 1, False)


def test_minimal_table_accounting_sees_a_row_left_unsent(empty_db_dsn: str) -> None:
    seed_minimal(empty_db_dsn, 0)
    seed_minimal(empty_db_dsn, 3)
    with psycopg.connect(empty_db_dsn) as conn:
        conn.execute(
            "UPDATE bench_minimal.outbox SET status = 2, attempts = 1 WHERE id < "
            "(SELECT max(id) FROM bench_minimal.outbox)"
        )
        conn.commit()

    result = verify_minimal(empty_db_dsn, 3, [])

    assert (result.processed, result.missing, result.exactly_once) == (2, 1, False)


@pytest.mark.slow
def test_a_tiny_drain_of_leasebox_and_every_plain_loop_sends_every_row_exactly_once(
    bench_server: BenchServer,
) -> None:
    systems = [
        plain_minimal_system(),
        plain_system(),
        statements_system(),
        statements_system(history=False),
        leasebox_system(),
    ]

    results = run_drain(bench_server, systems, [(300, 1)], timeout=60)

    assert [(r.system, r.error) for r in results] == [
        (PLAIN_MINIMAL, ""),
        (PLAIN_LEASEBOX_SCHEMA, ""),
        (STATEMENTS_WITH_HISTORY, ""),
        (STATEMENTS_WITHOUT_HISTORY, ""),
        (LEASEBOX, ""),
    ]
    for result in results:
        assert result.accounting is not None
        assert result.accounting.exactly_once, result.accounting
        assert result.accounting.processed == 300
        assert result.rate > 0
        assert result.cpu_seconds > 0
        assert result.cpu_us_per_message is not None


def test_cutting_the_history_out_of_leasebox_statements_leaves_the_rest_intact(
    db_conn: psycopg.Connection[Any],
) -> None:
    for name in ("claim", "mark_sent"):
        shipped = named_queries()[name].text
        cut = without_history(shipped)
        assert "{schema}.history" in shipped
        assert "{schema}.history" not in cut
        assert "{schema}.queue" in cut
        assert len(cut.splitlines()) < len(shipped.splitlines())
    claim, mark = product_statements(history=False)
    params = {
        "kinds": ["otp"],
        "after_at": [None],
        "after_id": [None],
        "priorities": [0],
        "aging": [0.0],
        "aged_limit": 0,
        "limit": 1,
    }
    db_conn.execute(claim, {**params, "lease_seconds": 1, "worker_id": "w", "now": None})
    db_conn.execute(
        mark,
        {"ids": [], "tokens": [], "provider_message_ids": [], "worker_id": "w", "now": None},
    )


def test_history_is_seeded_evenly_over_its_days(db_dsn: str) -> None:
    seed_history(db_dsn, 1000, days=10)

    with psycopg.connect(db_dsn) as conn:
        days = conn.execute(
            "SELECT (now() AT TIME ZONE 'UTC')::date - bucket, count(*) FROM leasebox.messages"
            " WHERE status = 'sent' GROUP BY 1 ORDER BY 1"
        ).fetchall()
        events = conn.execute(
            "SELECT event, count(DISTINCT outbox_id), count(*) FROM leasebox.history "
            "GROUP BY event ORDER BY event"
        ).fetchall()
        receipts = conn.execute(
            "SELECT count(DISTINCT outbox_id) FROM leasebox.receipts"
        ).fetchone()
        homeless = conn.execute("SELECT count(*) FROM leasebox.outbox_default").fetchone()

    assert days == [(day, 100) for day in range(1, 11)]
    assert events == [("claimed", 1000, 1000), ("sent", 1000, 1000)]
    assert receipts == (1000,)
    assert homeless == (0,)  # every day has its partition


def test_retention_drops_the_oldest_day_and_nothing_newer(db_dsn: str) -> None:
    seed_history(db_dsn, 1000, days=10)

    _, pruned, held = prune_oldest_day(db_dsn, 10)

    assert (pruned, held) == (100, 100)
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone()
        events = conn.execute("SELECT count(*) FROM leasebox.history").fetchone()
    assert (row, events) == ((900,), (1800,))


def test_a_retention_run_that_removed_too_few_or_too_many_rows_is_an_error() -> None:
    assert retention_error(100, 100) == ""
    assert "removed 99 messages" in retention_error(99, 100)
    assert "removed 101 messages" in retention_error(101, 100)


def test_the_history_timings_take_turns_between_the_databases_after_warming_each() -> None:
    calls: list[str] = []

    def action(name: str) -> Callable[[], None]:
        return lambda: calls.append(name)

    async def awaited(name: str) -> None:
        calls.append(name)

    timed = take_turns([action("empty"), action("kept")], 2)
    assert calls == ["empty", "kept"] * 5
    assert [len(times) for times in timed] == [2, 2]

    calls.clear()
    timed = asyncio.run(take_turns_async([lambda: awaited("empty"), lambda: awaited("kept")], 2))
    assert calls == ["empty", "kept"] * 5
    assert all(t >= 0 for times in timed for t in times)


@pytest.mark.slow
def test_a_tiny_history_run_drains_exactly_once_and_retention_drops_exactly_a_day(
    bench_server: BenchServer,
) -> None:
    result = run_history(bench_server, 2000, 150, 4, rounds=1, progress=lambda _: None)

    assert result.errors == []
    assert (result.pruned_rows, result.day_rows) == (200, 200)
    assert result.prune_seconds is not None
    for case in result.cases:
        assert case.drain is not None
        assert case.drain.ok, case.drain
        assert len(case.claim_ms) == 4
        assert len(case.backlog_ms) == 4
    assert [c.history_rows for c in result.cases] == [0, 2000]


@pytest.mark.slow
def test_the_http_benchmark_checks_worker_and_bare_loop_by_delivery_key(
    bench_server: BenchServer,
) -> None:
    found = run_http(bench_server, 120, 8, rounds=1, delay_seconds=0.01)

    assert found["bare"]["ok"], found["bare"]
    assert found["worker"]["ok"], found["worker"]
    assert found["worker"]["accounting"]["processed"] == 120
    assert "keys the stand-in accepted" in found["worker"]["accounting"]["note"]


@pytest.mark.slow
def test_the_smtp_benchmark_sends_every_row_once_over_pooled_connections(
    bench_server: BenchServer,
) -> None:
    found = run_smtp(bench_server, 60, rounds=1)

    assert found["worker"]["ok"], found["worker"]
    assert found["worker"]["cpu_us_per_message"] is not None


@pytest.mark.slow
def test_the_quota_benchmark_measures_every_message_at_the_sink(
    bench_server: BenchServer,
) -> None:
    [found] = run_quota(bench_server, [2], rate=40.0, seconds=1.0)

    assert found.error == "", found
    assert found.received == found.messages == 40
    assert found.accuracy is not None


@pytest.mark.slow
def test_the_otp_backlog_benchmark_times_the_otps_behind_the_backlog_both_ways(
    bench_server: BenchServer,
) -> None:
    found = run_backlog_latency(bench_server, backlog=3000, otp_rate=100.0, seconds=0.5)

    assert [r.priorities for r in found] == [True, False]
    assert all(r.sent == r.behind > 0 and not r.error for r in found), found
    for result in found:
        assert set(result.parts) == {"producer_transaction", "to_claim", "claim_to_sent"}
        assert all(0 < p50 <= p99 for p50, p99 in result.parts.values()), result.parts
        # Each OTP's latency is its wait for the claim and the claim's way to its send.
        to_claim, claim_to_sent = result.parts["to_claim"], result.parts["claim_to_sent"]
        assert result.max_ms is not None
        assert max(to_claim[1], claim_to_sent[1]) <= result.max_ms
        exported = result.as_dict()
        assert exported["producer_transaction_p99_ms"] == round(
            result.parts["producer_transaction"][1], 2
        )


def test_enqueue_writes_what_it_counts_in_every_case_the_batch_api_included(
    bench_server: BenchServer,
) -> None:
    results = {(r.method, r.mode): r for r in run_enqueue(bench_server, 20, 200)}

    assert batch_api() is not None
    assert len(results) == 10
    assert all(r.error == "" and r.rate > 0 for r in results.values())
    assert results[(LEASEBOX_MANY, MANY)].sends == 200
    assert results[(LEASEBOX_MANY_STATEMENTS, MANY)].sends == 200
    assert results[(LEASEBOX_STATEMENT, ONE)].sends == 20
    assert {method for method, mode in results if mode == WRAPPED} == {
        "plain INSERT",
        "leasebox.enqueue + receipt",
    }


def test_enqueue_reports_a_missing_batch_api_as_missing(
    bench_server: BenchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(leasebox, "enqueue_many")
    results = {(r.method, r.mode): r for r in run_enqueue(bench_server, 20, 200)}

    assert batch_api() is None
    missing = [r for r in results.values() if r.mode == MANY and r.method != PLAIN_MANY]
    assert [r.error for r in missing] == ["missing: leasebox has no enqueue_many"] * 2
    measured = [r for r in results.values() if r not in missing]
    assert len(measured) == 8
    assert all(r.error == "" and r.rate > 0 for r in measured)


def test_each_peers_producer_writes_one_job_per_send_in_both_modes(
    bench_server: BenchServer,
) -> None:
    peers, skipped = enqueue_peers.available()
    if not peers:
        pytest.skip(f"no peer to run: {skipped}")
    results = run_enqueue(bench_server, 20, 200, peers)

    by_peer = [r for r in results if r.method.startswith(("PgQueuer", "pg-boss"))]
    assert len(by_peer) == 2 * len(peers)
    assert all(r.error == "" and r.rate > 0 for r in by_peer), by_peer
    assert sorted(r.sends for r in by_peer) == [20] * len(peers) + [200] * len(peers)


def test_a_server_given_by_unix_socket_creates_databases_that_keep_their_name(
    tmp_path: Path,
) -> None:
    # A short folder of its own: a socket's path is limited to about 100 bytes.
    sockets = Path(tempfile.mkdtemp(prefix="lb-sock-", dir="/tmp"))
    postgres = EmbeddedPostgres(tmp_path / "data", socket_dir=sockets)
    postgres.start()
    server = BenchServer(f"postgresql://postgres@/postgres?host={sockets}&port={postgres.port}")
    try:
        dsn = server.create_database("socket", leasebox_schema=False)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT current_database(), inet_client_addr()").fetchone()
    finally:
        server.drop_all()
        postgres.destroy()
        shutil.rmtree(sockets, ignore_errors=True)

    assert row is not None
    assert row[0].startswith("bench_socket_")
    assert row[1] is None  # a Unix socket has no client address
