"""`leasebox trace` tells the story of a killed worker and of a stalled one, from real processes.

The two faults that may send a message twice look the same at the SMTP server (two copies
under one Message-ID) and differ in the history: a killed worker's lease runs out and it
never reports back; a stalled worker's lease runs out too, but it wakes, finishes its send
and reports it after another worker took the message over. The trace must tell them apart,
and its count of copies must account for what the server took. The tests wait for what the
server and the database show, never for a delay.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from leasebox.cli.main import main
from leasebox.delivery.providers.base import derived_message_id
from leasebox.inspection.narrative import chronicle, copies_answer, ownership_answer
from leasebox.inspection.trace import Ownership, Trace, build_trace
from leasebox.store.history import Selector, read_trace
from support.reliability_rig import SHORT_LEASE, SmtpServer, Workers, seed, statuses
from support.waiting import wait_for

pytestmark = pytest.mark.slow
WAITING = "&timeout=120"  # held sends must not time out while the test holds them


def traced(dsn: str, **selector: Any) -> Trace:
    """What `leasebox trace` reads and tells for `selector`."""
    chosen = Selector(**selector)
    with psycopg.connect(dsn) as conn:
        return build_trace(read_trace(conn, chosen), chosen)


def test_a_killed_workers_duplicates_are_told_as_leases_that_ran_out_unreported(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    sink.gate.clear()  # every send waits in DATA until the rows are locked
    keys = seed(db_dsn, 4)
    first = worker_processes.start(
        "--concurrency", "4", provider_options="&pool_size=4" + WAITING, lease=SHORT_LEASE
    )
    wait_for(lambda: sink.in_data == 4, what=first.log, timeout=30)
    with psycopg.connect(db_dsn) as lock:
        # The rows locked, the worker cannot record the sends the server now accepts: it is
        # killed between the provider's answer and its write, the window a crash duplicates.
        lock.execute("SELECT id FROM leasebox.queue FOR UPDATE")
        sink.gate.set()
        wait_for(lambda: sink.delivered == 4, what=lambda: sink.delivered, timeout=30)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        # Its statements waiting for the lock die with it, as a crashed pod's sessions do.
        lock.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        lock.rollback()
    worker_processes.start(provider_options=WAITING, lease=SHORT_LEASE)
    wait_for(lambda: statuses(db_dsn) == {"sent": 4}, what=lambda: statuses(db_dsn), timeout=60)
    worker_processes.stop_all()
    for key in keys:
        (send,) = traced(db_dsn, delivery_key=key).sends
        assert [(a.worker_id, a.outcome) for a in send.attempts] == [
            ("w1", "lease_expired"),
            ("w2", "sent"),
        ]
        assert send.attempts[0].late is None
        assert send.ownership == Ownership.TAKEN_OVER
        assert "w1 never reported back after its lease ran out" in ownership_answer(send)
        assert "claimed by w1, w1's lease ran out at " in chronicle(send)
        assert ", reclaimed by w2, sent by w2 at " in chronicle(send)
        assert (send.copies.accepted, send.copies.possible) == (1, 1)
        assert len(sink.copies[key]) == send.copies.accepted + send.copies.possible
        assert set(sink.copies[key]) == {send.message_id}


def test_a_stalled_workers_lost_lease_is_told_as_a_race_with_two_accepted_copies(
    db_dsn: str,
    smtp_server: SmtpServer,
    worker_processes: Workers,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sink = smtp_server.sink
    sink.hold = "stall@example.com"
    [key] = seed(db_dsn, 1, recipient=lambda _: "stall@example.com")
    first = worker_processes.start(lease=SHORT_LEASE, provider_options=WAITING)
    wait_for(lambda: sink.holding == 1, what=first.log, timeout=30)
    first.process.send_signal(signal.SIGSTOP)  # frozen mid-send: it can neither finish nor extend
    second = worker_processes.start(lease=SHORT_LEASE, provider_options=WAITING)
    wait_for(lambda: sink.holding == 2, what=second.log, timeout=30)
    first.process.send_signal(signal.SIGCONT)
    sink.held[0].set()  # the stalled worker's send is accepted, after its lease ran out
    lost = 'leasebox_lease_lost_total{kind="otp"}'
    worker_processes.wait_answering(first)
    wait_for(lambda: first.metric(lost) >= 1, what=first.log, timeout=30)
    sink.held[1].set()
    wait_for(lambda: statuses(db_dsn) == {"sent": 1}, what=lambda: statuses(db_dsn), timeout=30)
    worker_processes.stop_all()
    (send,) = traced(db_dsn, delivery_key=key).sends
    assert [(a.worker_id, a.outcome) for a in send.attempts] == [
        ("w1", "lease_expired"),
        ("w2", "sent"),
    ]
    late = send.attempts[0].late
    assert late is not None
    assert (late.worker_id, late.provider_message_id) == ("w1", derived_message_id(key))
    assert late.stalled_seconds is not None
    assert late.stalled_seconds > SHORT_LEASE
    assert send.ownership == Ownership.RACED
    assert ownership_answer(send).startswith("2 workers raced it (w1, w2): w1 kept sending")
    assert (send.copies.accepted, send.copies.possible) == (2, 0)
    assert copies_answer(send).startswith(
        f"the provider accepted 2 copies, all under the same delivery key '{key}' "
        f"(Message-ID {derived_message_id(key)})"
    )
    assert sink.copies[key] == [derived_message_id(key)] * 2
    assert main(["trace", "--dsn", db_dsn, "--id", str(send.outbox_id)]) == 0
    text = capsys.readouterr().out
    assert "lease lost by w1 at " in text
    assert "stall@example.com" not in text
    assert "s***@example.com" in text
