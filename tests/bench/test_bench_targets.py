"""The benchmark's verdicts are pure functions of one run's figures: each target must compare
leasebox with the yardstick the issue names, call a missing figure not evaluated (never
met), a missing product feature missing, and judge on the ratio it prints."""

from __future__ import annotations

from typing import Any

from bench.report import render
from bench.systems import (
    LEASEBOX,
    PLAIN_LEASEBOX_SCHEMA,
    PLAIN_MINIMAL,
    STATEMENTS_WITH_HISTORY,
    STATEMENTS_WITHOUT_HISTORY,
)
from bench.targets import (
    MET,
    MISSED,
    MISSING,
    NOT_EVALUATED,
    REPORTED,
    Target,
    all_targets,
    cpu_target,
    drain_targets,
    enqueue_targets,
    history_targets,
    latency_targets,
    otp_backlog_targets,
    provider_targets,
    quota_targets,
)


def _drain(
    system: str,
    rows: int,
    processes: int,
    rate: float,
    *,
    ok: bool = True,
    cpu: float | None = None,
) -> dict[str, Any]:
    return {
        "system": system,
        "rows": rows,
        "processes": processes,
        "rate_per_second": rate,
        "ok": ok,
        "cpu_us_per_message": cpu,
    }


def _by_name(found: list[Target]) -> dict[str, Target]:
    return {t.name: t for t in found}


def test_leasebox_must_be_strictly_ahead_of_the_best_peer_yardsticks_aside() -> None:
    drain = [
        _drain(LEASEBOX, 100, 1, 900.0),
        _drain("PgQueuer", 100, 1, 800.0),
        _drain("pg-boss", 100, 1, 950.0),
        _drain(PLAIN_MINIMAL, 100, 1, 5000.0),
        _drain(PLAIN_LEASEBOX_SCHEMA, 100, 1, 3000.0),
    ]

    ahead = _by_name(drain_targets(drain, [100]))["drain-0.1k-1p-ahead"]

    assert (ahead.status, round(ahead.ratio or 0, 3)) == (MISSED, round(900 / 950, 3))
    assert "pg-boss" in ahead.measured


def test_a_tie_with_the_best_peer_is_not_ahead() -> None:
    drain = [_drain(LEASEBOX, 100, 1, 900.0), _drain("pg-boss", 100, 1, 900.0)]

    assert _by_name(drain_targets(drain, [100]))["drain-0.1k-1p-ahead"].met is False


def test_the_drain_must_lead_the_best_peer_by_a_fifth() -> None:
    short = [_drain(LEASEBOX, 100, 1, 1190.0), _drain("PgQueuer", 100, 1, 1000.0)]
    enough = [_drain(LEASEBOX, 100, 1, 1200.0), _drain("PgQueuer", 100, 1, 1000.0)]

    missed = _by_name(drain_targets(short, [100]))["drain-0.1k-1p-ahead"]
    met = _by_name(drain_targets(enough, [100]))["drain-0.1k-1p-ahead"]

    assert (missed.status, met.status) == (MISSED, MET)
    assert ">= 1.2x every peer" in met.goal


def test_a_failed_peer_is_named_and_not_counted_as_beaten() -> None:
    drain = [
        _drain(LEASEBOX, 100, 2, 900.0),
        _drain("PgQueuer", 100, 2, 10.0, ok=False),
        _drain("pg-boss", 100, 2, 500.0),
    ]

    ahead = _by_name(drain_targets(drain, [100]))["drain-0.1k-2p-ahead"]

    assert ahead.met is True
    assert "PgQueuer failed" in ahead.measured


def test_the_drain_is_judged_against_the_minimal_table_and_reported_against_its_schema() -> None:
    drain = [
        _drain(LEASEBOX, 100, 1, 590.0),
        _drain(PLAIN_MINIMAL, 100, 1, 1000.0),
        _drain(PLAIN_LEASEBOX_SCHEMA, 100, 1, 700.0),
    ]

    found = _by_name(drain_targets(drain, [100]))

    assert found["drain-0.1k-1p-vs-limit"].status == MISSED
    assert found["drain-0.1k-1p-vs-limit"].ratio == 0.59
    assert found["drain-0.1k-1p-vs-schema"].status == REPORTED
    assert "0.70x the limit" in found["drain-0.1k-1p-vs-schema"].measured


def test_the_drain_must_reach_four_fifths_of_the_minimal_table() -> None:
    def verdict(rate: float) -> str:
        drain = [_drain(LEASEBOX, 100, 1, rate), _drain(PLAIN_MINIMAL, 100, 1, 1000.0)]
        return _by_name(drain_targets(drain, [100]))["drain-0.1k-1p-vs-limit"].status

    assert (verdict(790.0), verdict(800.0)) == (MISSED, MET)


def test_the_historys_cost_is_its_statements_with_it_against_without_it_where_both_ran() -> None:
    drain = [
        _drain(LEASEBOX, 100, 1, 590.0),
        _drain(STATEMENTS_WITH_HISTORY, 100, 1, 880.0),
        _drain(STATEMENTS_WITHOUT_HISTORY, 100, 1, 1000.0),
    ]

    found = _by_name(drain_targets(drain, [100]))
    alone = _by_name(drain_targets([_drain(LEASEBOX, 100, 1, 590.0)], [100]))

    assert found["history-cost-0.1k"].status == REPORTED
    assert found["history-cost-0.1k"].ratio == 0.88
    assert found["history-cost-0.1k"].measured == "880/s with it vs 1,000/s without"
    assert "history-cost-0.1k" not in alone


def test_the_backlog_drain_must_keep_ninety_percent_of_the_small_rate() -> None:
    steady = [_drain(LEASEBOX, 100, 1, 1000.0), _drain(LEASEBOX, 10_000, 1, 905.0)]
    slower = [_drain(LEASEBOX, 100, 1, 1000.0), _drain(LEASEBOX, 10_000, 1, 895.0)]

    assert _by_name(drain_targets(steady, [100], 10_000))["drain-10k-backlog"].met is True
    assert _by_name(drain_targets(slower, [100], 10_000))["drain-10k-backlog"].met is False


def test_a_failed_leasebox_drain_leaves_its_targets_not_evaluated() -> None:
    drain = [_drain(LEASEBOX, 100, 1, 900.0, ok=False), _drain("PgQueuer", 100, 1, 10.0)]

    found = _by_name(drain_targets(drain, [100]))

    assert found["drain-0.1k-1p-ahead"].status == NOT_EVALUATED
    assert found["drain-0.1k-1p-vs-limit"].met is None


def test_cpu_per_message_is_read_from_the_largest_one_process_drain() -> None:
    drain = [
        _drain(LEASEBOX, 100, 1, 900.0, cpu=40.0),
        _drain(LEASEBOX, 1000, 1, 900.0, cpu=14.0),
        _drain(PLAIN_MINIMAL, 1000, 1, 900.0, cpu=7.0),
        _drain(LEASEBOX, 5000, 2, 900.0, cpu=99.0),
    ]

    found = _by_name(cpu_target(drain))

    assert (found["cpu-null"].status, found["cpu-null"].ratio) == (MET, 14.0 / 15.0)
    assert "1,000 rows" in found["cpu-null"].goal


def test_cpu_above_fifteen_microseconds_is_missed_where_the_minimal_loop_needs_under_ten() -> None:
    drain = [
        _drain(LEASEBOX, 100, 1, 900.0, cpu=15.5),
        _drain(PLAIN_MINIMAL, 100, 1, 900.0, cpu=9.9),
    ]

    assert _by_name(cpu_target(drain))["cpu-null"].status == MISSED


def test_cpu_on_a_host_where_the_minimal_loop_needs_ten_microseconds_is_reported_not_judged() -> (
    None
):
    drain = [
        _drain(LEASEBOX, 100, 1, 900.0, cpu=21.0),
        _drain(PLAIN_MINIMAL, 100, 1, 900.0, cpu=14.0),
    ]

    bound = _by_name(cpu_target(drain))["cpu-null"]

    assert (bound.status, bound.met, bound.ratio) == (REPORTED, None, 21.0 / 15.0)
    assert "14.0 µs on this host" in bound.measured


def test_cpu_without_the_minimal_loop_cannot_tell_whether_its_bound_applies() -> None:
    found = _by_name(cpu_target([_drain(LEASEBOX, 100, 1, 900.0, cpu=12.0)]))

    assert found["cpu-null"].status == NOT_EVALUATED
    assert found["cpu-null-vs-minimal"].status == NOT_EVALUATED


def test_cpu_is_always_reported_as_a_ratio_to_the_minimal_loops_own() -> None:
    for minimal in (6.0, 14.0):
        drain = [
            _drain(LEASEBOX, 100, 1, 900.0, cpu=12.0),
            _drain(PLAIN_MINIMAL, 100, 1, 900.0, cpu=minimal),
        ]

        share = _by_name(cpu_target(drain))["cpu-null-vs-minimal"]

        assert (share.status, share.ratio) == (REPORTED, 12.0 / minimal)
        assert share.measured == f"12.0 µs vs {minimal:.1f} µs"


def _history(
    claim: tuple[float, float], drain: tuple[float, float], prune: float, errors: list[str]
) -> dict[str, Any]:
    def case(rows: int, claim_ms: float, rate: float) -> dict[str, Any]:
        return {
            "history_rows": rows,
            "claim_ms_median": claim_ms,
            "backlog_ms_median": 2.0,
            "drain": {"ok": True, "rate_per_second": rate},
        }

    return {
        "cases": [case(0, claim[0], drain[0]), case(10_000_000, claim[1], drain[1])],
        "prune_day_seconds": prune,
        "pruned_rows": 1_000_000,
        "day_rows": 1_000_000,
        "errors": errors,
    }


def test_history_targets_bound_claim_drain_and_retention() -> None:
    found = _by_name(history_targets(_history((1.0, 1.2), (1000.0, 950.0), 0.2, [])))

    assert found["history-claim"].status == MISSED
    assert found["history-backlog"].status == MET
    assert found["history-drain"].status == MET
    assert found["history-retention"].status == MET


def test_retention_that_took_a_second_or_lost_count_is_not_met() -> None:
    slow = _by_name(history_targets(_history((1.0, 1.0), (1.0, 1.0), 1.0, [])))
    wrong = _by_name(history_targets(_history((1.0, 1.0), (1.0, 1.0), 0.1, ["removed 3"])))

    assert slow["history-retention"].status == MISSED
    assert wrong["history-retention"].status == NOT_EVALUATED


def _enqueue(method: str, mode: str, rate: float | None, error: str = "") -> dict[str, Any]:
    return {"method": method, "mode": mode, "rate_per_second": rate, "error": error}


def test_enqueue_against_a_plain_insert_is_reported_and_a_missing_batch_api_is_missing() -> None:
    from bench.enqueue_rate import LEASEBOX as LB
    from bench.enqueue_rate import LEASEBOX_MANY, LOOP, MANY, ONE, PLAIN, PLAIN_MANY, WRAPPED

    enqueue = [
        _enqueue(PLAIN, ONE, 1000.0),
        _enqueue(LB, ONE, 510.0),
        _enqueue(PLAIN, WRAPPED, 400.0),
        _enqueue(LB, WRAPPED, 300.0),
        _enqueue(PLAIN, LOOP, 2000.0),
        _enqueue(LB, LOOP, 1000.0),
        _enqueue(PLAIN_MANY, MANY, 30000.0),
        _enqueue(LEASEBOX_MANY, MANY, None, "missing: leasebox has no enqueue_many"),
    ]

    found = _by_name(enqueue_targets(enqueue))

    assert (found["enqueue-single"].status, found["enqueue-single"].ratio) == (REPORTED, 0.51)
    assert found["enqueue-batch"].status == MISSING
    assert found["enqueue-batch-vs-peers"].status == MISSING
    assert found["enqueue-loop"].status == REPORTED
    assert (found["enqueue-wrapped"].status, found["enqueue-wrapped"].ratio) == (REPORTED, 0.75)


def _peers(single: tuple[float, float], batch: tuple[float, float]) -> list[dict[str, Any]]:
    from bench.enqueue_peers import PGBOSS_MANY, PGBOSS_ONE, PGQUEUER
    from bench.enqueue_rate import MANY, ONE

    return [
        _enqueue(PGQUEUER, ONE, single[0]),
        _enqueue(PGBOSS_ONE, ONE, single[1]),
        _enqueue(PGQUEUER, MANY, batch[0]),
        _enqueue(PGBOSS_MANY, MANY, batch[1]),
    ]


def test_the_producer_is_judged_against_the_faster_peer_in_each_mode() -> None:
    from bench.enqueue_rate import LEASEBOX as LB
    from bench.enqueue_rate import LEASEBOX_MANY, MANY, ONE

    enqueue = [
        _enqueue(LB, ONE, 2500.0),
        _enqueue(LEASEBOX_MANY, MANY, 20000.0),
        *_peers((2000.0, 1200.0), (30000.0, 26000.0)),
    ]

    found = _by_name(enqueue_targets(enqueue))
    single, batch = found["enqueue-single-vs-peers"], found["enqueue-batch-vs-peers"]

    assert (single.status, single.ratio) == (MET, 1.25)
    assert single.measured == (
        "leasebox 2,500/s, best peer PgQueuer Queries.enqueue + dedupe_key 2,000/s"
    )
    assert (batch.status, round(batch.ratio or 0, 3)) == (MISSED, round(20000 / 30000, 3))


def test_a_tie_with_the_faster_peers_producer_is_not_ahead() -> None:
    from bench.enqueue_rate import LEASEBOX as LB
    from bench.enqueue_rate import ONE

    enqueue = [_enqueue(LB, ONE, 2000.0), *_peers((2000.0, 1200.0), (1.0, 1.0))]

    assert _by_name(enqueue_targets(enqueue))["enqueue-single-vs-peers"].met is False


def test_a_failed_peer_producer_is_named_and_not_counted_and_none_is_not_evaluated() -> None:
    from bench.enqueue_peers import PGBOSS_ONE, PGQUEUER
    from bench.enqueue_rate import LEASEBOX as LB
    from bench.enqueue_rate import ONE

    one_failed = [
        _enqueue(LB, ONE, 1500.0),
        _enqueue(PGQUEUER, ONE, 9000.0, "101 jobs, not 100"),
        _enqueue(PGBOSS_ONE, ONE, 1200.0),
    ]
    alone = [_enqueue(LB, ONE, 1500.0)]

    judged = _by_name(enqueue_targets(one_failed))["enqueue-single-vs-peers"]
    unjudged = _by_name(enqueue_targets(alone))["enqueue-single-vs-peers"]

    assert (judged.status, judged.ratio) == (MET, 1.25)
    assert f"{PGQUEUER} failed: not counted" in judged.measured
    assert (unjudged.status, unjudged.met) == (NOT_EVALUATED, None)


def test_leasebox_statements_with_ready_arguments_are_reported_against_the_same_yardsticks() -> (
    None
):
    from bench.enqueue_rate import (
        LEASEBOX_MANY_STATEMENTS,
        LEASEBOX_STATEMENT,
        MANY,
        ONE,
        PLAIN,
        PLAIN_MANY,
    )

    enqueue = [
        _enqueue(PLAIN, ONE, 1000.0),
        _enqueue(LEASEBOX_STATEMENT, ONE, 600.0),
        _enqueue(PLAIN_MANY, MANY, 40000.0),
        _enqueue(LEASEBOX_MANY_STATEMENTS, MANY, 10000.0),
    ]

    found = _by_name(enqueue_targets(enqueue))

    single, batch = found["enqueue-single-statement"], found["enqueue-batch-statements"]
    assert (single.status, single.ratio) == (REPORTED, 0.6)
    assert (batch.status, batch.ratio) == (REPORTED, 0.25)
    assert single.measured == "600/s vs 1,000/s"


def test_a_statement_row_without_a_figure_is_not_evaluated() -> None:
    from bench.enqueue_rate import LEASEBOX_MANY_STATEMENTS, MANY, PLAIN_MANY

    enqueue = [
        _enqueue(PLAIN_MANY, MANY, 40000.0),
        _enqueue(LEASEBOX_MANY_STATEMENTS, MANY, None, "missing: leasebox has no enqueue_many"),
    ]

    assert _by_name(enqueue_targets(enqueue))["enqueue-batch-statements"].status == NOT_EVALUATED


def test_provider_targets_compare_with_the_bare_loop_and_bound_smtp_cpu() -> None:
    providers = {
        "http": {
            "delay_ms": 50.0,
            "concurrency": 64,
            "bare": {"ok": True, "rate_per_second": 1000.0},
            "worker": {"ok": True, "rate_per_second": 790.0, "cpu_us_per_message": 300.0},
        },
        "smtp": {
            "pool_size": 8,
            "worker": {"ok": True, "rate_per_second": 900.0, "cpu_us_per_message": 199.0},
        },
    }

    found = _by_name(provider_targets(providers))

    assert found["provider-http"].status == MISSED
    assert found["provider-smtp-cpu"].status == MET


def test_latency_needs_p99_under_ten_milliseconds_and_the_rate_held() -> None:
    def row(p99: float, achieved: float) -> dict[str, Any]:
        return {
            "listen_notify": True,
            "target_rate": 500.0,
            "achieved_rate": achieved,
            "p99_ms": p99,
            "p50_ms": 1.0,
            "error": "",
        }

    assert [t.status for t in latency_targets([row(9.9, 500.0)])] == [MET]
    assert [t.status for t in latency_targets([row(10.0, 500.0)])] == [MISSED]
    assert [t.status for t in latency_targets([row(1.0, 400.0)])] == [NOT_EVALUATED]


def test_all_targets_of_an_empty_run_are_none_rather_than_invented() -> None:
    assert all_targets({}) == []


def _quota(workers: int, accuracy: float | None, error: str = "") -> dict[str, Any]:
    return {
        "workers": workers,
        "quota_per_second": 50.0,
        "rate_per_second": None if accuracy is None else 50.0 * accuracy,
        "accuracy": accuracy,
        "ahead_seconds": 0.01,
        "error": error,
    }


def test_a_quota_is_met_within_five_percent_either_way_and_judged_per_worker_count() -> None:
    found = quota_targets([_quota(1, 1.02), _quota(4, 0.949), _quota(16, 1.051), _quota(16, None)])
    assert [t.status for t in found] == [MET, MISSED, MISSED, NOT_EVALUATED]
    assert [t.name for t in found[:3]] == ["quota-1-workers", "quota-4-workers", "quota-16-workers"]
    assert found[0].ratio is not None
    assert round(found[0].ratio, 2) == 0.4  # a 2 % deviation is 0.4 of the 5 % allowed
    assert [t.status for t in quota_targets([_quota(4, 1.0, "70 of 75 arrived")])] == [
        NOT_EVALUATED
    ]


def _otp(priorities: bool, p99: float | None, error: str = "") -> dict[str, Any]:
    return {
        "priorities": priorities,
        "backlog": 100_000,
        "otps": 200,
        "otps_behind_the_backlog": 180,
        "p50_ms": 3.0,
        "p99_ms": p99,
        "error": error,
    }


def test_an_otp_behind_the_backlog_is_judged_with_priorities_and_named_against_fifo() -> None:
    [met] = otp_backlog_targets([_otp(True, 9.0), _otp(False, 4000.0)])
    [missed] = otp_backlog_targets([_otp(True, 12.0)])
    [void] = otp_backlog_targets([_otp(True, 5.0, "no OTP arrived while a tenth was left")])
    assert (met.status, missed.status, void.status) == (MET, MISSED, NOT_EVALUATED)
    assert "first in, first out: p99 4000.0 ms" in met.measured
    assert "parts at p99" not in met.measured  # a run from before the parts were measured


def test_an_otp_miss_names_the_parts_of_its_latency_at_p99() -> None:
    row = {
        **_otp(True, 12.0),
        "producer_transaction_p99_ms": 6.1,
        "to_claim_p99_ms": 8.3,
        "claim_to_sent_p99_ms": 4.5,
    }
    [missed] = otp_backlog_targets([row])
    assert missed.status == MISSED
    assert (
        "parts at p99: the producer's transaction 6.1 ms, to the claim 8.3 ms, "
        "claim to sent 4.5 ms" in missed.measured
    )


def test_the_otp_table_shows_each_part_as_p50_and_p99_and_n_a_for_an_older_run() -> None:
    measured = {
        **_otp(True, 12.0),
        "max_ms": 15.0,
        "producer_transaction_p50_ms": 2.5,
        "producer_transaction_p99_ms": 6.1,
        "to_claim_p50_ms": 2.8,
        "to_claim_p99_ms": 8.3,
        "claim_to_sent_p50_ms": 2.4,
        "claim_to_sent_p99_ms": 4.5,
    }
    older = {**_otp(False, 4000.0), "max_ms": 4100.0}
    text = render({"otp_backlog": [measured, older]})
    rows = [line for line in text.splitlines() if line.startswith("| priorities")]
    assert rows == [
        "| priorities | 100,000 | 180 | 3.0 | 12.0 | 15.0 | 2.5 / 6.1 | 2.8 / 8.3 | 2.4 / 4.5 |"
    ]
    assert (
        "| first in, first out | 100,000 | 180 | 3.0 | 4,000.0 | 4,100.0 | n/a | n/a | n/a |"
        in text
    )
