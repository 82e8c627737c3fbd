"""The delivery guarantee, checked by invariants over real worker processes and real SMTP.

Every accepted message is delivered; a duplicate appears only where a fault was injected
(a killed or stalled worker, a database restart), never more than the messages that were in
flight there, and always with the Message-ID of its first copy, so that a mail system that
deduplicates drops it. The tests wait for what the SMTP server and the database show (sends
held, rows held, copies taken), never for a delay.
"""

from __future__ import annotations

import random
import signal
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from leasebox.delivery.providers.base import derived_message_id
from leasebox.store.suppressions import Entry, add_suppressions
from support.history import Event, check_histories, events, histories_at
from support.reliability_rig import (
    SHORT_LEASE,
    RestartableDatabase,
    SmtpServer,
    SmtpSink,
    Workers,
    lease_losses,
    seed,
    statuses,
)
from support.waiting import wait_for

pytestmark = pytest.mark.slow

CONCURRENCY = 16
# What a worker may hold at once (its batch size is its concurrency): the sends in flight, a
# claimed batch waiting for a slot, and a batch whose outcomes are being written.
HELD_AT_MOST = 3 * CONCURRENCY
POOLED = ("--concurrency", str(CONCURRENCY))
PROVIDER_POOL = f"&pool_size={CONCURRENCY}"
# Sends the test holds on purpose must not time out meanwhile (the hold is the signal).
WAITING = "&timeout=120"
WAITING_POOL = PROVIDER_POOL + WAITING


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
    wait_for(lambda: statuses(db_dsn) == {"sent": 5000}, what=lambda: statuses(db_dsn), timeout=120)
    sent = [w.metric('leasebox_sent_total{kind="otp"}') for w in worker_processes.started]
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
    assert report("no faults", sink) == 0
    assert sink.delivered == 5000
    assert sum(sent) == 5000
    assert all(n > 0 for n in sent), sent  # every worker took part
    assert history_checked(db_dsn) == 5000
    assert {tuple(events(h)) for h in histories_at(db_dsn).values()} == {("claimed", "sent")}


def test_killed_workers_duplicate_only_what_they_held_with_the_same_message_id(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    keys = seed(db_dsn, 5000)
    # A suppression list that bars none of them: every claim runs its suppression check too,
    # racing the other workers' claims.
    with psycopg.connect(db_dsn) as conn:
        add_suppressions(conn, [Entry("nobody@example.org", reason="manual")])
    for _ in range(4):
        worker_processes.start(*POOLED, provider_options=PROVIDER_POOL, lease=SHORT_LEASE)
    chooser = random.Random(3)
    held_at_kill: list[set[str]] = []
    leases_at_kill: list[tuple[str, dict[int, uuid.UUID]]] = []
    for fraction in (0.25, 0.5, 0.75):
        wait_for(
            lambda: sink.delivered >= 5000 * fraction,  # noqa: B023
            what=lambda: sink.delivered,
            timeout=120,
        )
        victim = chooser.choice([w for w in worker_processes.started if w.process.poll() is None])
        # Frozen first, so that it claims nothing more between the count and the kill: what
        # it holds now is all it can have sent without recording it.
        victim.process.send_signal(signal.SIGSTOP)
        held_at_kill.append(held_by(db_dsn, victim.name))
        leases_at_kill.append((victim.name, leases_held_by(db_dsn, victim.name)))
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=10)
        worker_processes.start(*POOLED, provider_options=PROVIDER_POOL, lease=SHORT_LEASE)
    wait_for(lambda: statuses(db_dsn) == {"sent": 5000}, what=lambda: statuses(db_dsn), timeout=120)
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
    sizes = [len(held) for held in held_at_kill]
    extra = report(f"3 SIGKILLs (rows held at each kill: {sizes})", sink)
    assert all(n <= HELD_AT_MOST for n in sizes), sizes
    # A message is sent once more at most for every kill of a worker that held it, and for
    # every lease a (merely slow) worker logged as lost.
    lost = keys_of(db_dsn, lease_losses([w.log() for w in worker_processes.started]))
    for key, copies in sink.duplicates().items():
        explained = sum(key in held for held in held_at_kill) + lost.count(key)
        assert len(copies) - 1 <= explained, key
    assert extra <= sum(sizes) + len(lost)
    # The history tells each killed worker's rows as they went: its lease expired, another
    # worker claimed the row, and that one (or a later one) sent it.
    assert history_checked(db_dsn) == 5000
    written = histories_at(db_dsn)
    victims = {name for name, _ in leases_at_kill}
    for killed, leases in leases_at_kill:
        for outbox_id, token in leases.items():
            after = after_lease(written[outbox_id], token)
            if after[0].event == "sent":  # its statement was on its way when it froze
                assert after[0].worker_id == killed, after
                continue
            assert (after[0].event, after[0].worker_id) == ("lease_expired", killed)
            assert after[1].event == "claimed", after
            assert after[1].worker_id != killed, after
            [sent] = [e for e in after if e.event == "sent"]
            assert sent.worker_id not in victims, after


def keys_of(dsn: str, ids: list[int]) -> list[str]:
    """The delivery key of each outbox id, in the same order (repeats kept)."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT id, delivery_key FROM leasebox.outbox WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    key: dict[int, str] = {int(i): str(k) for i, k in found}
    return [key[i] for i in ids]


def leases_held_by(dsn: str, worker: str) -> dict[int, uuid.UUID]:
    """The rows `worker` holds under a lease, with the lease's token."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id, lease_token FROM leasebox.queue WHERE status = 'processing'"
            " AND leased_by = %s",
            (worker,),
        ).fetchall()
    return {int(outbox_id): token for outbox_id, token in rows}


def after_lease(history: list[Event], token: uuid.UUID) -> list[Event]:
    """What a message's history says from the end of one lease on, late lease losses aside."""
    ended = next(e for e in history if e.lease_token == token and e.event != "claimed")
    rest = history[history.index(ended) :]
    return [e for e in rest if e.event != "lease_lost" or e is ended]


def history_checked(dsn: str) -> int:
    """Check every message's history against the state diagram and its row; how many."""
    with psycopg.connect(dsn) as conn:
        return check_histories(conn)


def held_by(dsn: str, worker: str) -> set[str]:
    """The delivery keys of the rows `worker` holds under a lease."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT delivery_key FROM leasebox.queue WHERE status = 'processing'"
            " AND leased_by = %s",
            (worker,),
        ).fetchall()
    return {key for (key,) in rows}


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
    wait_for(lambda: statuses(db_dsn) == done, what=lambda: statuses(db_dsn), timeout=120)
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
            "SELECT status, dead_reason, attempts, last_error_class FROM leasebox.messages"
            " WHERE delivery_key = %s",
            (rejected_key,),
        ).fetchone()
    assert row == ("dead", "rejected", 1, "smtp_550")
    assert history_checked(db_dsn) == 1001
    retried = sum(events(h).count("retry") for h in histories_at(db_dsn).values())
    assert retried == sink.transient_failures


@pytest.mark.embedded_only
def test_workers_reconnect_after_a_database_restart_and_lose_nothing(
    restartable_database: RestartableDatabase, smtp_server: SmtpServer, tmp_path: Path
) -> None:
    server, dsn = restartable_database.server, restartable_database.dsn
    sink = smtp_server.sink
    sink.close_gate_at = 400  # the sends wait there while the database goes away
    keys = seed(dsn, 2000)
    workers = Workers(dsn, smtp_server.port, tmp_path)
    try:
        for _ in range(2):
            workers.start(*POOLED, provider_options=WAITING_POOL, lease=SHORT_LEASE)
        wait_for(lambda: not sink.gate.is_set() and sink.in_data > 0, what=workers.logs, timeout=60)
        before = sink.delivered
        server.stop()
        # The sends held at the gate now finish while the database is away: the workers
        # know outcomes they cannot write yet.
        sink.gate.set()
        wait_for(lambda: sink.delivered > before, what=workers.logs, timeout=60)
        server.start()
        wait_for(lambda: statuses(dsn) == {"sent": 2000}, what=lambda: _safe(dsn), timeout=120)
        workers.stop_all()
        logs = [w.log() for w in workers.started]
    finally:
        workers.kill_all()
    assert before < 2000, "the restart came after the work was done"
    assert_each_delivered_with_its_own_message_id(sink, keys)
    extra = report("database restart", sink)
    assert extra <= 2 * HELD_AT_MOST
    # The outage reached the workers (a worker whose connections were all idle may notice it
    # only as a silent pool reconnect), and they survived it: `stop_all` saw exit code 0.
    assert any("AdminShutdown" in log for log in logs)
    assert history_checked(dsn) == 2000


def _safe(dsn: str) -> object:
    try:
        return statuses(dsn)
    except psycopg.OperationalError as exc:
        return f"database down: {type(exc).__name__}"


def test_a_worker_stalled_past_its_lease_cannot_settle_the_row_and_counts_the_loss(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    sink.hold = "stall@example.com"
    [key] = seed(db_dsn, 1, recipient=lambda _: "stall@example.com")
    first = worker_processes.start(lease=SHORT_LEASE, provider_options=WAITING)
    wait_for(lambda: sink.holding == 1, what=first.log, timeout=30)
    # The stall: the process is frozen mid-send, so it can neither finish nor extend.
    first.process.send_signal(signal.SIGSTOP)
    second = worker_processes.start(lease=SHORT_LEASE, provider_options=WAITING)
    # The second worker reclaimed the row, claimed it, and is sending it: not settled yet.
    wait_for(lambda: sink.holding == 2, what=second.log, timeout=30)
    assert lease_of(db_dsn) == ("processing", "w2")
    first.process.send_signal(signal.SIGCONT)
    sink.held[0].set()  # only the first worker's send completes
    lost, sent = 'leasebox_lease_lost_total{kind="otp"}', 'leasebox_sent_total{kind="otp"}'
    worker_processes.wait_answering(first)
    wait_for(lambda: first.metric(lost) + first.metric(sent) >= 1, what=first.log, timeout=30)
    assert (first.metric(lost), first.metric(sent)) == (1, 0)
    assert lease_of(db_dsn) == ("processing", "w2")  # the second worker's row, left alone
    sink.held[1].set()
    wait_for(lambda: statuses(db_dsn) == {"sent": 1}, what=lambda: statuses(db_dsn), timeout=30)
    worker_processes.stop_all()
    assert second.log().count('"reclaimed an expired lease (pending)"') == 1
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT leased_by, attempts, provider_message_id FROM leasebox.messages"
        ).fetchone()
    assert row == ("w2", 2, derived_message_id(key))
    assert sink.copies[key] == [derived_message_id(key)] * 2
    assert second.log().count('"lease lost') == 0
    # The history: the first lease ran out and was taken back, the second worker claimed and
    # sent the row, and the stalled one's late acceptance is kept as a lost lease, with the
    # provider's id of the second copy it made.
    [history] = histories_at(db_dsn).values()
    assert [(e.event, e.worker_id) for e in history] == [
        ("claimed", "w1"),
        ("lease_expired", "w1"),
        ("claimed", "w2"),
        ("lease_lost", "w1"),
        ("sent", "w2"),
    ]
    first_lease, _, second_lease, late, done = history
    assert late.lease_token == first_lease.lease_token != second_lease.lease_token
    assert (late.attempt, late.provider_message_id) == (1, derived_message_id(key))
    assert (done.lease_token, done.provider_message_id) == (
        second_lease.lease_token,
        derived_message_id(key),
    )
    assert history_checked(db_dsn) == 1


def lease_of(dsn: str) -> tuple[str, str] | None:
    """(status, leased_by) of the one row."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT status, leased_by FROM leasebox.messages").fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def test_sigterm_during_a_burst_finishes_sends_and_releases_the_rest_at_once(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink = smtp_server.sink
    sink.gate.clear()  # every send waits in DATA until the test lets them go
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
        "120",
        provider_options="&pool_size=4" + WAITING,
    )
    wait_for(
        lambda: sink.in_data == 4 and statuses(db_dsn).get("processing") == 8,
        what=first.log,
        timeout=30,
    )
    first.process.send_signal(signal.SIGTERM)
    # While the 4 sends in flight are still held, the 4 claimed but unsent rows go back.
    wait_for(
        lambda: statuses(db_dsn).get("processing") == 4, what=lambda: statuses(db_dsn), timeout=30
    )
    assert statuses(db_dsn) == {"processing": 4, "pending": 36}
    assert sink.in_data == 4
    assert first.process.poll() is None  # still in its grace period, waiting for them
    sink.gate.set()
    assert first.process.wait(timeout=60) == 0, first.log()
    assert statuses(db_dsn) == {"sent": 4, "pending": 36}
    second = worker_processes.start("--drain", "--concurrency", "16", "--lease-seconds", "60")
    assert second.process.wait(timeout=60) == 0, second.log()
    assert statuses(db_dsn) == {"sent": 40}
    assert_each_delivered_with_its_own_message_id(sink, keys)
    assert report("SIGTERM during a burst", sink) == 0
    assert history_checked(db_dsn) == 40
    told = Counter(tuple(events(h)) for h in histories_at(db_dsn).values())
    released = ("claimed", "released", "claimed", "sent")
    assert told == {("claimed", "sent"): 36, released: 4}


def test_a_provider_outage_is_retried_and_reported_by_readiness(
    db_dsn: str, smtp_server: SmtpServer, worker_processes: Workers
) -> None:
    sink, port = smtp_server.sink, smtp_server.port
    worker = worker_processes.start()
    worker_processes.wait_ready(worker)  # its provider started before the outage
    smtp_server.stop()
    keys = seed(db_dsn, 10, max_attempts=40)
    wait_for(
        lambda: worker.metric('leasebox_retries_total{error_class="connection",kind="otp"}') > 0,
        what=worker.log,
        timeout=30,
    )
    status, reason = worker.readiness()
    assert status == 503
    assert reason.startswith(f"not ready: provider: SMTP server smtp://127.0.0.1:{port}")
    smtp_server.start()
    wait_for(lambda: statuses(db_dsn) == {"sent": 10}, what=lambda: statuses(db_dsn), timeout=60)
    status, text = worker.readiness()
    assert (status, text.splitlines()[0]) == (200, "ready")
    worker_processes.stop_all()
    assert_each_delivered_with_its_own_message_id(sink, keys)
