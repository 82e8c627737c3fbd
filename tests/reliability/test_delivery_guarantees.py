"""The delivery guarantee, checked by invariants over real worker processes and real SMTP.

Every accepted message is delivered; a duplicate appears only where a fault was injected
(a killed or stalled worker, a database restart), never more than the messages that were in
flight there, and always with the Message-ID of its first copy, so that a mail system that
deduplicates drops it.
"""

from __future__ import annotations

import os
import random
import signal

import psycopg
import pytest

from leasebox.delivery.providers.base import derived_message_id
from leasebox.testing.embedded import EmbeddedPostgres
from support.reliability_rig import (
    SHORT_LEASE,
    SmtpServer,
    SmtpSink,
    Workers,
    seed,
    statuses,
    wait_until,
)

pytestmark = pytest.mark.slow

CONCURRENCY = 16
CAPACITY = 2 * CONCURRENCY  # sends in flight plus one claimed batch waiting for a slot
POOLED = ("--concurrency", str(CONCURRENCY))
PROVIDER_POOL = f"&pool_size={CONCURRENCY}"


def assert_each_delivered_with_its_own_message_id(sink: SmtpSink, keys: list[str]) -> None:
    missing = [key for key in keys if key not in sink.copies]
    assert not missing, f"{len(missing)} messages never delivered"
    for key in keys:
        assert set(sink.copies[key]) == {derived_message_id(key)}, key


def report(label: str, sink: SmtpSink) -> int:
    duplicates = sink.duplicates()
    extra = sum(len(ids) - 1 for ids in duplicates.values())
    print(f"{label}: {sink.delivered} delivered, {extra} duplicate copies")
    return extra


def test_four_workers_deliver_5000_messages_exactly_once(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    keys = seed(db_dsn, 5000)
    for _ in range(4):
        worker_processes.start(*POOLED, provider_options=PROVIDER_POOL)
    wait_until(lambda: statuses(db_dsn) == {"sent": 5000}, 120, lambda: statuses(db_dsn))
    sent = [w.metric('leasebox_sent_total{kind="otp"}') for w in worker_processes.started]
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
    assert report("no faults", sink) == 0
    assert sink.delivered == 5000
    assert sum(sent) == 5000
    assert all(n > 0 for n in sent), sent  # every worker took part


def test_killed_workers_cause_only_bounded_duplicates_with_the_same_message_id(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    keys = seed(db_dsn, 5000)
    for _ in range(4):
        worker_processes.start(*POOLED, provider_options=PROVIDER_POOL, lease=SHORT_LEASE)
    chooser = random.Random(3)
    held_at_kill = []
    for fraction in (0.25, 0.5, 0.75):
        wait_until(lambda: sink.delivered >= 5000 * fraction, 120, lambda: sink.delivered)  # noqa: B023
        victim = chooser.choice([w for w in worker_processes.started if w.process.poll() is None])
        with psycopg.connect(db_dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM leasebox.outbox WHERE status = 'processing'"
                " AND leased_by = %s",
                (victim.name,),
            ).fetchone()
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=10)
        held_at_kill.append(row[0] if row else 0)
        worker_processes.start(*POOLED, provider_options=PROVIDER_POOL, lease=SHORT_LEASE)
    wait_until(lambda: statuses(db_dsn) == {"sent": 5000}, 120, lambda: statuses(db_dsn))
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
    extra = report(f"3 SIGKILLs (rows held at each kill: {held_at_kill})", sink)
    assert extra <= 3 * CAPACITY
    # Only rows that a killed worker had claimed were delivered twice.
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT delivery_key, attempts FROM leasebox.outbox WHERE delivery_key = ANY(%s)",
            (list(sink.duplicates()),),
        ).fetchall()
    assert all(attempts >= 2 for _, attempts in rows), rows


def test_transient_failures_are_retried_to_delivery_and_a_rejection_dead_letters_once(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    sink.transient_ratio = 0.3
    sink.rejected.add("rejected@example.com")
    # 0.3**20: no message runs out of attempts by bad luck.
    keys = seed(db_dsn, 1000, max_attempts=20)
    [rejected_key] = seed(db_dsn, 1, recipient=lambda _: "rejected@example.com")
    for _ in range(2):
        worker_processes.start(*POOLED, provider_options=PROVIDER_POOL)
    done = {"sent": 1000, "dead": 1}
    wait_until(lambda: statuses(db_dsn) == done, 120, lambda: statuses(db_dsn))
    retries = sum(
        w.metric('leasebox_retries_total{error_class="smtp_451",kind="otp"}')
        for w in worker_processes.started
    )
    dead = sum(
        w.metric('leasebox_dead_letters_total{kind="otp",reason="rejected"}')
        for w in worker_processes.started
    )
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
    assert report("30% transient failures", sink) == 0
    assert sink.transient_failures > 200
    assert retries == sink.transient_failures
    assert dead == 1
    assert sink.recipient_attempts["rejected@example.com"] == 1
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT status, dead_reason, attempts, last_error_class FROM leasebox.outbox"
            " WHERE delivery_key = %s",
            (rejected_key,),
        ).fetchone()
    assert row == ("dead", "rejected", 1, "smtp_550")


@pytest.mark.embedded_only
@pytest.mark.skipif(
    bool(os.environ.get("LEASEBOX_TEST_DSN")),
    reason="restarting PostgreSQL needs the embedded server this suite owns; "
    "LEASEBOX_TEST_DSN names a shared server that must not be restarted",
)
def test_workers_reconnect_after_a_database_restart_and_lose_nothing(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers, pg_server: EmbeddedPostgres
) -> None:
    sink = smtp_server.sink
    sink.delay = 0.005
    keys = seed(db_dsn, 2000)
    for _ in range(2):
        worker_processes.start(*POOLED, provider_options=PROVIDER_POOL, lease=SHORT_LEASE)
    wait_until(lambda: sink.delivered >= 400, 60, lambda: sink.delivered)
    pg_server.restart(downtime_seconds=1.0)
    assert sink.delivered < 2000, "the restart came too late to matter"
    wait_until(lambda: statuses(db_dsn) == {"sent": 2000}, 120, lambda: _safe(db_dsn))
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
    extra = report("database restart", sink)
    assert extra <= 2 * CAPACITY
    # The outage reached the workers (a worker whose connections were all idle may notice it
    # only as a silent pool reconnect), and they survived it: `stop_all` saw exit code 0.
    assert any("AdminShutdown" in w.log() for w in worker_processes.started)


def _safe(dsn: str) -> object:
    try:
        return statuses(dsn)
    except psycopg.OperationalError as exc:
        return f"database down: {type(exc).__name__}"


def test_a_worker_stalled_past_its_lease_cannot_mark_sent_and_counts_the_loss(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    sink.hold_once = "stall@example.com"
    [key] = seed(db_dsn, 1, recipient=lambda _: "stall@example.com")
    first = worker_processes.start(lease=SHORT_LEASE)
    wait_until(sink.holding.is_set, 30, first.log)
    # The stall: the process is frozen mid-send, so it can neither finish nor extend.
    first.process.send_signal(signal.SIGSTOP)
    second = worker_processes.start(lease=SHORT_LEASE)
    wait_until(lambda: statuses(db_dsn) == {"sent": 1}, 30, lambda: statuses(db_dsn))
    first.process.send_signal(signal.SIGCONT)
    sink.release.set()
    lost = 'leasebox_lease_lost_total{kind="otp"}'
    worker_processes.wait_ready(first)
    wait_until(lambda: first.metric(lost) == 1, 30, first.log)
    worker_processes.stop_all()
    assert second.log().count('"reclaimed an expired lease (pending)"') == 1
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT leased_by, attempts, provider_message_id FROM leasebox.outbox"
        ).fetchone()
    assert row == ("w2", 2, derived_message_id(key))
    assert sink.copies[key] == [derived_message_id(key)] * 2
    assert second.log().count('"lease lost') == 0


def test_sigterm_during_a_burst_finishes_sends_and_releases_the_rest_at_once(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    sink.delay = 3.0
    keys = seed(db_dsn, 40)
    # A long lease: released rows must be picked up because they were released, not expired.
    first = worker_processes.start(
        "--concurrency",
        "4",
        "--batch-size",
        "4",
        "--lease-seconds",
        "60",
        "--grace",
        "10",
        provider_options="&pool_size=4",
    )
    wait_until(lambda: sink.in_data == 4 and statuses(db_dsn).get("processing") == 8, 30, first.log)
    first.process.send_signal(signal.SIGTERM)
    # Before the sends in flight finish, the 4 claimed but unsent rows are pending again.
    wait_until(lambda: statuses(db_dsn).get("processing") == 4, 2.0, lambda: statuses(db_dsn))
    assert sink.in_data == 4
    assert first.process.wait(timeout=15) == 0, first.log()
    assert statuses(db_dsn) == {"sent": 4, "pending": 36}
    sink.delay = 0
    second = worker_processes.start("--drain", "--concurrency", "16", "--lease-seconds", "60")
    assert second.process.wait(timeout=60) == 0, second.log()
    assert statuses(db_dsn) == {"sent": 40}
    assert_each_delivered_with_its_own_message_id(sink, keys)
    assert report("SIGTERM during a burst", sink) == 0


def test_a_provider_outage_is_retried_and_reported_by_readiness(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink, port = smtp_server.sink, smtp_server.port
    worker = worker_processes.start()
    worker_processes.wait_ready(worker)
    smtp_server.stop()
    keys = seed(db_dsn, 10, max_attempts=40)
    wait_until(
        lambda: worker.metric('leasebox_retries_total{error_class="connection",kind="otp"}') > 0,
        30,
        worker.log,
    )
    status, reason = worker.readiness()
    assert status == 503
    assert reason.startswith(f"not ready: provider: SMTP server smtp://127.0.0.1:{port}")
    smtp_server.start()
    wait_until(lambda: statuses(db_dsn) == {"sent": 10}, 60, lambda: statuses(db_dsn))
    status, text = worker.readiness()
    assert (status, text.splitlines()[0]) == (200, "ready")
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
