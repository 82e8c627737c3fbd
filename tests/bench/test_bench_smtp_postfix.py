"""The SMTP-against-Postfix benchmark's verdict is arithmetic over its runs, and a run counts
only when Postfix delivered each of its messages exactly once; one tiny run against the
session's Postfix checks the harness end to end (never judged on speed)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from bench.smtp_postfix import delivered, evaluate, exactly_once, run_client, summary

from support.postfix import Postfix

PASSED = {"ok": True, "summary": "13 passed"}


def _run(client: str, tls: bool, cpu: float, **changes: Any) -> dict[str, Any]:
    run = {
        "client": client,
        "tls": tls,
        "messages": 100,
        "seconds": 1.0,
        "failed": 0,
        "rate_per_second": 100.0,
        "cpu_us_per_message": cpu,
        "exactly_once": True,
        "error": "",
    }
    return {**run, **changes}


def _runs(own: float, theirs: float, **changes: Any) -> list[dict[str, Any]]:
    return [
        _run("own", False, own, **changes),
        _run("aiosmtplib", False, theirs),
        _run("own", True, own),
        _run("aiosmtplib", True, theirs),
    ]


def test_the_target_is_the_ratio_of_cpu_per_message_over_plain_smtp() -> None:
    met = evaluate(summary(_runs(300.0, 700.0)), PASSED)
    missed = evaluate(summary(_runs(650.0, 700.0)), PASSED)

    assert (round(met["ratio"], 2), met["status"]) == (0.43, "met")
    assert (round(missed["ratio"], 2), missed["status"]) == (0.93, "MISSED")


def test_a_failing_postfix_suite_misses_the_target_however_cheap() -> None:
    target = evaluate(summary(_runs(100.0, 700.0)), {"ok": False, "summary": "1 failed"})

    assert target["status"] == "MISSED"
    assert "1 failed" in target["measured"]


def test_a_run_not_delivered_exactly_once_leaves_the_target_not_evaluated() -> None:
    target = evaluate(summary(_runs(100.0, 700.0, exactly_once=False)), PASSED)

    assert (target["ratio"], target["status"]) == (None, "not evaluated")


def test_exactly_once_wants_every_timed_and_warm_up_key_once() -> None:
    keys = Counter({"p:0": 1, "p:1": 1, "p:w0": 1})

    assert exactly_once(keys, "p:", 2, 1)
    assert not exactly_once(keys + Counter({"p:1": 1}), "p:", 2, 1)
    assert not exactly_once(Counter({"p:0": 1, "p:w0": 1}), "p:", 2, 1)


@pytest.mark.parametrize("client", ["own", "aiosmtplib"])
def test_a_tiny_run_of_each_client_is_delivered_exactly_once(
    postfix_server: Postfix, client: str
) -> None:
    run = run_client(postfix_server, client, tls=True, messages=20, prefix=f"otp:tiny:{client}:")

    assert (run["error"], run["failed"], run["exactly_once"]) == ("", 0, True), run
    assert run["cpu_us_per_message"] > 0
    assert delivered(postfix_server, f"otp:tiny:{client}:", 0, timeout=0) == Counter()
