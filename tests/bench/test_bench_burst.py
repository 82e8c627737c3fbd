"""The burst benchmark, run tiny on a real PostgreSQL: each drain comes out exactly-once and
reads its figures from the history; its verdict is arithmetic (never judged on speed)."""

from __future__ import annotations

from bench.burst import FRESH, NEVER_ANALYSED, BurstRun, drain_burst, evaluate, median_rate
from bench.pgserver import BenchServer


def test_a_tiny_burst_drains_exactly_once_with_and_without_statistics(
    bench_server: BenchServer,
) -> None:
    runs = [drain_burst(bench_server, case, 300, window=600) for case in (NEVER_ANALYSED, FRESH)]

    for run in runs:
        assert (run.error, run.exactly_once) == ("", True), run
        # The window outlasts the drain: every message was sent inside it.
        assert run.sent_in_window == 300
        assert run.drain_seconds > 0
        assert run.rate == 300 / run.drain_seconds
    assert runs[1].analysed_before_drain
    assert evaluate(runs)["status"] in {"met", "MISSED", "not evaluated"}


def _run(
    case: str, sent: int, *, analysed: bool = False, ok: bool = True, round_: int = 1
) -> BurstRun:
    return BurstRun(case, 1000, 8.0, sent, 10.0, analysed, ok, round=round_)


def test_the_burst_target_is_the_ratio_of_the_first_seconds() -> None:
    target = evaluate([_run(NEVER_ANALYSED, 720), _run(FRESH, 800, analysed=True)])

    assert (round(target["ratio"], 2), target["status"]) == (0.9, "met")
    missed = evaluate([_run(NEVER_ANALYSED, 80), _run(FRESH, 800, analysed=True)])
    assert (round(missed["ratio"], 2), missed["status"]) == (0.1, "MISSED")


def test_a_burst_analysed_before_its_drain_or_not_exactly_once_is_not_evaluated() -> None:
    fresh = _run(FRESH, 800, analysed=True)

    analysed_early = evaluate([_run(NEVER_ANALYSED, 800, analysed=True), fresh])
    doubled = evaluate([_run(NEVER_ANALYSED, 800, ok=False), fresh])

    assert analysed_early["status"] == doubled["status"] == "not evaluated"


def test_the_burst_target_compares_the_medians_of_the_rounds_leaving_void_ones_out() -> None:
    runs = [
        _run(NEVER_ANALYSED, 500, round_=1),
        _run(FRESH, 800, analysed=True, round_=1),
        _run(NEVER_ANALYSED, 760, round_=2),
        _run(FRESH, 790, analysed=True, round_=2),
        _run(NEVER_ANALYSED, 800, analysed=True, round_=3),  # autovacuum was first: void
        _run(FRESH, 850, analysed=True, round_=3),
        _run(NEVER_ANALYSED, 740, round_=4),
        _run(FRESH, 20, ok=False, round_=4),  # not exactly once: left out
    ]

    target = evaluate(runs)

    # Over the 8 s window: 62.5, 95 and 92.5 a second; 100, 98.75 and 106.25.
    assert median_rate(runs, NEVER_ANALYSED) == 92.5
    assert median_rate(runs, FRESH) == 100.0
    assert (round(target["ratio"], 3), target["status"]) == (0.925, "met")
    assert "medians of 3 and 3 rounds" in target["measured"]
