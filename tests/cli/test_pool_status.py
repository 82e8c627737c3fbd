"""`kubectl leasebox status` in words: the verdict says whether the SLA is met and by how
much, and falls back on the pool's status when the database cannot be read from here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from leasebox.cli.kubectl import build_parser
from leasebox.cli.pool_status import PoolStatus, render_text

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _pool(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "otp", "namespace": "mail", "generation": 3},
        "spec": {
            "kinds": ["otp"],
            "database": {"secretRef": {"name": "db"}},
            "sla": {"oldestPendingAgeSeconds": 10},
            **spec,
        },
        "status": {
            "observedGeneration": 3,
            "backlog": {"pending": 40, "dead": 1, "oldestPendingAgeSeconds": 38.0},
            "conditions": [
                {"type": "SLAMet", "status": "False", "reason": "SLAExceeded",
                 "lastTransitionTime": "2026-12-01T11:59:00Z", "message": "38s old"},
            ],
        },
    }  # fmt: skip


def _backlog(age: float) -> list[dict[str, Any]]:
    return [
        {"kind": "otp", "pending": 3, "ready": 3, "processing": 1, "dead": 0, "expiredLeases": 0,
         "oldestPendingAgeSeconds": age, "sentPerSecond": 2.5},
    ]  # fmt: skip


def test_the_verdict_says_by_how_much_the_sla_is_met_or_missed() -> None:
    met = PoolStatus("otp", "mail", _pool(), backlog=_backlog(4.0), now=NOW)
    missed = PoolStatus("otp", "mail", _pool(), backlog=_backlog(38.0), now=NOW)
    assert met.verdict() == (
        True,
        "SLA met: the oldest pending message is 4.0 s old, 6.0 s within its 10 s.",
    )
    assert missed.verdict() == (
        False,
        "SLA MISSED: the oldest pending message is 38 s old, 28 s over its 10 s.",
    )


def test_without_the_database_the_pool_status_backlog_is_shown_and_why() -> None:
    state = PoolStatus(
        "otp", "mail", _pool(paused=True), database_problem="Secret mail/db does not exist", now=NOW
    )
    text = render_text(state)
    first, *rest = text.splitlines()
    assert first == (
        "SLA MISSED: the oldest pending message is 38 s old, 28 s over its 10 s. "
        "The pool is paused: its workers are held at 0."
    )
    assert "Database:   schema leasebox (Secret db, key dsn): not read from here (Secret " in text
    assert any(line.split()[:4] == ["otp", "(from", "the", "pool's"] for line in rest)
    assert any(line.split()[:4] == ["SLAMet", "False", "SLAExceeded", "60"] for line in rest)
    assert "Recent events\n  (none)" in text


def test_a_pool_never_polled_has_no_verdict_yet() -> None:
    pool = _pool()
    pool["status"] = {}
    assert PoolStatus("otp", "mail", pool, now=NOW).verdict() == (
        None,
        "SLA unknown: no backlog has been read yet.",
    )


def test_the_namespace_flag_works_after_the_command_as_kubectl_passes_it() -> None:
    args = build_parser().parse_args(["status", "otp", "-n", "mail", "-o", "json"])
    assert (args.command, args.pool, args.command_namespace, args.output) == (
        "status",
        "otp",
        "mail",
        "json",
    )
