"""`leasebox demo` proves its guarantees on a real run, and fails loudly when one breaks."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from leasebox.cli import demo as demo_command
from leasebox.demo.evidence import history_account
from leasebox.demo.report import (
    CAUSE_AMBIGUOUS,
    CAUSE_KILLED,
    CAUSE_LEASE_LOST,
    ApiStats,
    Copy,
    Evidence,
    HistoryAccount,
    Kill,
    OutboxRow,
    percentile,
    render,
    summarise,
    verdict,
)
from leasebox.demo.scenario import REJECTED_ADDRESS, Scenario
from leasebox.inspection.trace import build_story
from leasebox.store.history import HistoryEvent, TracedRow

ROOT = Path(__file__).resolve().parents[2]


def row(outbox_id: int, status: str = "sent", recipient: str = "a@example.com") -> OutboxRow:
    return OutboxRow(
        id=outbox_id,
        status=status,
        dead_reason="rejected" if status == "dead" else None,
        recipient=recipient,
        delivery_key=f"otp:u:{outbox_id}",
        latency_seconds=0.5 if status == "sent" else None,
    )


def copy(outbox_id: int, message_id: str | None = None) -> Copy:
    return Copy(f"otp:u:{outbox_id}", message_id or f"<m{outbox_id}@leasebox>")


KILLED_STORY = (
    "claimed by demo-worker-2, demo-worker-2's lease ran out at 2026-12-01T12:00:45Z after "
    "45 s, reclaimed by demo-worker-3, sent by demo-worker-3 at 2026-12-01T12:00:48Z"
)
KILLED = HistoryAccount(sent=1, vanished=("demo-worker-2",), story=KILLED_STORY)


def evidence(**overrides: Any) -> Evidence:
    """A healthy run: three sends, one bounced, one duplicate behind a killed worker."""
    fields: dict[str, Any] = {
        "accepted": {"c1": 1, "c2": 2, "c3": 3},
        "rows": [row(1), row(2), row(3, "dead", REJECTED_ADDRESS)],
        "copies": [copy(1), copy(2), copy(2)],
        "kills": [Kill("demo-worker-2", 10.0, frozenset({2}))],
        "histories": {2: KILLED},
        "lease_lost_reported": 0,
        "retries": 4,
        "transient_rejections": 4,
        "expected_dead_recipients": frozenset({REJECTED_ADDRESS}),
        "api": ApiStats(requests=4, created=3, replayed=1, checks={"reused key -> 422": True}),
        "scaling": [],
    }
    fields.update(overrides)
    return Evidence(**fields)


def test_the_verdict_holds_when_every_duplicate_follows_the_killed_worker() -> None:
    summary = summarise(evidence())
    assert verdict(summary) == []
    assert summary.delivered == 2
    assert summary.duplicates_by_cause() == {CAUSE_KILLED: 1}
    assert "Guarantees held" in render(summary)


def test_a_lost_send_fails_the_verdict_naming_its_outbox_id() -> None:
    summary = summarise(evidence(copies=[copy(2)], rows=[row(1, "pending"), row(2), row(3)]))
    reasons = verdict(summary)
    assert any("lost" in r and "1" in r for r in reasons)
    assert "GUARANTEES VIOLATED" in render(summary)


def test_an_accepted_challenge_without_an_outbox_row_is_lost() -> None:
    summary = summarise(evidence(accepted={"c1": 1, "c2": 2, "c3": 3, "c4": -1}))
    assert summary.lost == (-1,)


def test_a_duplicate_whose_history_shows_one_clean_send_fails_the_verdict() -> None:
    summary = summarise(evidence(histories={2: HistoryAccount(sent=1)}))
    assert any(
        "without a crash or lease loss in their attempt history" in r for r in verdict(summary)
    )


def test_a_kill_the_history_does_not_show_explains_no_duplicate() -> None:
    summary = summarise(evidence(histories={}))
    assert summary.duplicates[0].cause == "unexplained"
    assert verdict(summary)
    assert "outbox id 2, 2 copies, unexplained: no attempt history" in render(summary)


def test_a_duplicate_after_a_lost_lease_is_explained() -> None:
    stalled = HistoryAccount(sent=1, late_accepted=1, story="lease lost by demo-worker-1")
    summary = summarise(evidence(kills=[], histories={2: stalled}))
    assert verdict(summary) == []
    assert summary.duplicates_by_cause() == {CAUSE_LEASE_LOST: 1}


def test_a_duplicate_after_an_ambiguous_send_is_explained_as_such() -> None:
    summary = summarise(evidence(kills=[], histories={2: HistoryAccount(sent=1, ambiguous=1)}))
    assert verdict(summary) == []
    assert summary.duplicates_by_cause() == {CAUSE_AMBIGUOUS: 1}


def test_the_report_tells_each_duplicate_from_its_attempt_history() -> None:
    text = render(summarise(evidence()))
    assert "Duplicates, from the attempt history (`leasebox trace --id N`)" in text
    assert f"outbox id 2, 2 copies, worker killed mid-send: {KILLED_STORY}" in text
    assert "holding 1 lease(s): by the attempt history, 1 of them was taken by the server" in text


def test_more_than_one_extra_copy_per_crash_fails_the_verdict() -> None:
    summary = summarise(evidence(copies=[copy(1), copy(2), copy(2), copy(2)]))
    assert verdict(summary)


def test_a_duplicate_under_another_message_id_fails_the_verdict() -> None:
    summary = summarise(evidence(copies=[copy(1), copy(2), copy(2, "<other@leasebox>")]))
    assert any("different Message-ID" in r for r in verdict(summary))


def test_a_row_marked_sent_that_never_arrived_fails_the_verdict() -> None:
    summary = summarise(evidence(copies=[copy(2)]))
    assert any("never reached the provider" in r for r in verdict(summary))


def test_an_unexpected_dead_letter_and_a_delivered_bounce_fail_the_verdict() -> None:
    rows = [row(1, "dead"), row(2), row(3, "sent", REJECTED_ADDRESS)]
    summary = summarise(evidence(rows=rows, copies=[copy(2), copy(3)], kills=[]))
    reasons = verdict(summary)
    assert any("unexpected dead letter" in r for r in reasons)
    assert any("did not end as a dead letter" in r for r in reasons)


def test_a_failed_api_check_or_a_replay_mismatch_fails_the_verdict() -> None:
    api = ApiStats(replay_mismatches=1, checks={"reused key -> 422": False})
    reasons = verdict(summarise(evidence(api=api)))
    assert any("different challenge" in r for r in reasons)
    assert any("reused key -> 422" in r for r in reasons)


def test_a_suppressed_send_to_the_bounced_address_is_no_loss_but_a_missing_one_fails() -> None:
    bounced = "mistyped@bounces.example"
    held = summarise(
        evidence(
            accepted={"c1": 1, "c2": 2, "c3": 3, "c4": 4},
            rows=[row(1), row(2), row(3, "dead", REJECTED_ADDRESS), row(4, "suppressed", bounced)],
            expected_suppressed_recipients=frozenset({bounced}),
        )
    )
    missing = summarise(evidence(expected_suppressed_recipients=frozenset({bounced})))
    assert (held.suppressed, held.lost) == ((4,), ())
    assert verdict(held) == []
    assert any("bounced and were sent to again" in reason for reason in verdict(missing))


def test_percentiles_use_the_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_a_shortened_scenario_keeps_the_order_of_events() -> None:
    scenario = Scenario.shortened(20)
    assert 0 < scenario.burst_start < scenario.failure_start < scenario.kill_at < 20
    assert scenario.provider_failing(scenario.failure_start)
    with pytest.raises(ValueError, match="at least 15"):
        Scenario.shortened(5)


def test_the_command_exits_non_zero_with_the_reason_when_a_guarantee_breaks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = summarise(evidence(histories={}))

    async def fake_run(settings: Any, out: Any, live: bool, report: Any) -> Any:
        report(broken)
        return broken

    monkeypatch.setattr("leasebox.demo.run.run_demo", fake_run)
    args = argparse.Namespace(
        duration=20.0,
        keep_running=False,
        data_dir=Path("build/unused"),
        keep_data=False,
        seed=1,
        no_live=True,
        sla=10.0,
        no_alerts=True,
        json=True,
    )
    assert demo_command.run(args) == demo_command.EXIT_VIOLATED
    captured = capsys.readouterr()
    assert "without a crash or lease loss" in captured.err
    assert json.loads(captured.out)["violations"]


@pytest.mark.slow
def test_a_shortened_demo_delivers_every_accepted_send_and_explains_each_duplicate() -> None:
    data_dir = ROOT / "build" / f"test-demo-{os.getpid()}"
    command = [sys.executable, "-m", "leasebox", "demo", "--duration", "15", "--json"]
    try:
        result = subprocess.run(
            [*command, "--no-live", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=150,
            cwd=ROOT,
            check=False,
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["violations"] == []
    dead = summary["dead_letters"]
    assert len(dead) == 1
    assert dead[0][1] == "rejected"
    # The mistyped address bounced after its first send; its second ended suppressed.
    assert len(summary["suppressed"]) == 1
    assert summary["missing_suppressed"] == []
    assert summary["bounce_answer"] == "200 stored 1 of 1"
    assert summary["logical_sends_accepted"] == (
        summary["delivered"] + len(dead) + len(summary["suppressed"])
    )
    assert summary["lost"] == []
    assert summary["unfinished"] == []
    (kill,) = summary["kills"]
    extra = sum(d["copies"] - 1 for d in summary["duplicates"])
    assert extra <= kill["leased"] + summary["lease_lost_reported"]
    assert all(len(d["message_ids"]) == 1 for d in summary["duplicates"])
    assert summary["retries"] > 0
    assert summary["transient_rejections"] > 0
    assert summary["api"]["replayed"] > 0
    assert summary["api"]["replay_mismatches"] == 0
    assert all(summary["api"]["checks"].values())
    assert summary["codes_checked"] == summary["delivered"]
    assert summary["codes_mismatched"] == 0


def _event(
    event_id: int, event: str, seconds: float, worker: str, token: int, **f: Any
) -> HistoryEvent:
    values: dict[str, Any] = dict.fromkeys(
        (
            "attempt",
            "lease_expires_at",
            "retry_delay_seconds",
            "error_class",
            "error",
            "dead_reason",
            "provider_message_id",
        )
    )
    values.update(f)
    moment = datetime(2026, 12, 1, 12, tzinfo=UTC) + timedelta(seconds=seconds)
    return HistoryEvent(
        2, event_id, event, moment, lease_token=UUID(int=token), worker_id=worker, **values
    )


def test_the_history_account_counts_what_the_trace_story_found() -> None:
    outbox = TracedRow(
        2, "otp", "u", "a@example.com", "otp:u:2", "sent", 2, 8,
        datetime(2026, 12, 1, 12, tzinfo=UTC), None, None, None, None, None, None, None,
    )  # fmt: skip
    killed = [
        _event(1, "claimed", 0, "w1", 1),
        _event(2, "lease_expired", 47, "w1", 1),
        _event(3, "claimed", 48, "w2", 2),
        _event(4, "sent", 49, "w2", 2, provider_message_id="<m>"),
    ]
    account = history_account(build_story(outbox, [], killed))
    assert (account.sent, account.late_accepted, account.vanished) == (1, 0, ("w1",))
    assert account.story.startswith("claimed by w1, w1's lease ran out")
    stalled = [*killed, _event(5, "lease_lost", 52, "w1", 1, provider_message_id="<m>")]
    account = history_account(build_story(outbox, [], stalled))
    assert (account.sent, account.late_accepted, account.vanished) == (1, 1, ())
    assert account.cause(1) == CAUSE_LEASE_LOST
    assert account.cause(2) == "unexplained"
