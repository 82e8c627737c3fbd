"""The benchmark harness is tested like the rest: its accounting must catch a lost or doubled
message, its targets must not call a missing figure met, and a tiny drain of leasebox and the
plain baseline must come out exactly-once on a real PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest
from bench.accounting import account_ids, account_table, net_rate, percentile
from bench.drain import DrainResult, keep_better, run_drain
from bench.pgserver import BenchServer
from bench.systems import leasebox_system, plain_system, seed_outbox, verify_outbox
from bench.targets import drain_targets, enqueue_targets, scale_targets


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


def _drain_row(
    system: str, rows: int, processes: int, rate: float, ok: bool = True
) -> dict[str, object]:
    return {
        "system": system,
        "rows": rows,
        "processes": processes,
        "rate_per_second": rate,
        "ok": ok,
    }


def test_drain_targets_compare_leasebox_with_peers_of_the_same_run() -> None:
    drain = [
        _drain_row("leasebox", 100, 1, 900.0),
        _drain_row("PgQueuer", 100, 1, 1000.0),
        _drain_row("plain-psycopg", 100, 1, 1500.0),
        _drain_row("leasebox", 500, 1, 880.0),
        _drain_row("PgQueuer", 500, 1, 700.0),
        _drain_row("plain-psycopg", 500, 1, 5000.0),
    ]

    found = {t.name: t.met for t in drain_targets(drain, 100, 500)}

    assert found == {
        "drain-vs-pgqueuer": False,
        "drain-vs-plain": True,
        "drain-0k-ahead-1p": True,
        "drain-0k-steady-1p": True,
    }


def test_a_failed_drain_leaves_its_target_not_evaluated_rather_than_met() -> None:
    drain = [_drain_row("leasebox", 100, 1, 900.0), _drain_row("PgQueuer", 100, 1, 10.0, False)]

    found = {t.name: t.met for t in drain_targets(drain, 100, 100)}

    assert found["drain-vs-pgqueuer"] is None


def test_enqueue_and_scale_targets_use_ratios() -> None:
    enqueue = [
        {"method": "plain INSERT", "mode": "one per transaction", "rate_per_second": 1000.0},
        {
            "method": "leasebox.enqueue + receipt",
            "mode": "one per transaction",
            "rate_per_second": 650.0,
        },
    ]
    scale = [
        {"sent_rows": 10, "claim_ms_median": 1.0, "backlog_ms_median": 2.0},
        {"sent_rows": 1000, "claim_ms_median": 1.9, "backlog_ms_median": 4.5},
    ]

    assert [t.met for t in enqueue_targets(enqueue)] == [False]
    assert [t.met for t in scale_targets(scale)] == [True, False]


def test_outbox_accounting_sees_a_row_that_was_claimed_twice(db_dsn: str) -> None:
    seed_outbox(db_dsn, 4)
    with psycopg.connect(db_dsn) as conn:
        conn.execute("UPDATE leasebox.outbox SET status = 'sent', attempts = 1")
        conn.execute(
            "UPDATE leasebox.outbox SET attempts = 2 WHERE id = (SELECT min(id) "
            "FROM leasebox.outbox)"
        )
        conn.commit()

    result = verify_outbox(db_dsn, 4, [])

    assert (result.processed, result.duplicates, result.exactly_once) == (4, 1, False)


@pytest.mark.slow
def test_a_tiny_drain_of_leasebox_and_the_baseline_sends_every_row_exactly_once(
    server_dsn: str,
) -> None:
    server = BenchServer(server_dsn)
    try:
        results = run_drain(server, [plain_system(), leasebox_system()], [(300, 1)], timeout=60)
    finally:
        server.drop_all()

    assert [(r.system, r.error) for r in results] == [("plain-psycopg", ""), ("leasebox", "")]
    for result in results:
        assert result.accounting is not None
        assert result.accounting.exactly_once, result.accounting
        assert result.accounting.processed == 300
        assert result.rate > 0
