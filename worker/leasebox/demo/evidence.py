"""Collecting the demo's evidence from its three witnesses, after the traffic has drained.

The clients know which challenges the API confirmed, the outbox knows what it did with each
row, and the SMTP server knows what it received. None of them is trusted alone: the verdict
in `demo_report` compares them. This module only reads them into plain values, and checks
that every delivered code matches the hash its challenge stored, which shows that a secret
encrypted at rest in the outbox reached the user intact. For each message the server got
more than once it reads the row's attempt history and tells its story the way `leasebox
trace` does, so that the verdict explains a duplicate from what the workers recorded.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

from leasebox.db.queries import SqlFile, query
from leasebox.demo.otp_api import SQL_FILE, OtpApiSettings, code_digest
from leasebox.demo.report import (
    ApiStats,
    Copy,
    Evidence,
    HistoryAccount,
    Kill,
    OutboxRow,
    ScalingEvent,
)
from leasebox.demo.scenario import BOUNCING_ADDRESS, REJECTED_ADDRESS, ClientRecord
from leasebox.demo.sla import SlaAccount
from leasebox.inspection.narrative import chronicle
from leasebox.inspection.trace import SendStory, build_story
from leasebox.states import Event
from leasebox.store.history import read_traces_async
from leasebox.testing.smtp_sink import ReceivedMessage, SmtpSink

_CODE_LINE = re.compile(r"^\s+(\d{4,12})\s*$", re.MULTILINE)

DEMO_SQL = SqlFile("leasebox.demo", "demo.sql")


@dataclass
class EvidenceLog:
    """What the control loop noticed while the run went on."""

    kills: list[Kill] = field(default_factory=list)
    scaling: list[ScalingEvent] = field(default_factory=list)
    unfinished: int = -1  # rows pending or processing at the last look; -1 before the first
    # The oldest pending message's age at each look (t, seconds), and the scripted events.
    oldest: list[tuple[float, float]] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    bounce_answer: str | None = None  # the feedback receiver's answer to the demo's bounce


def check_codes(
    copies: list[ReceivedMessage], hashes: dict[str, str], pepper: bytes
) -> tuple[int, int]:
    """(checked, mismatched) over the first copy of each delivered challenge email."""
    checked = mismatched = 0
    seen: set[str] = set()
    for copy in copies:
        key = copy.delivery_key or ""
        if key in seen or not key.startswith("otp:"):
            continue
        seen.add(key)
        challenge_id = key.rsplit(":", 1)[1]
        match = _CODE_LINE.search(copy.text or "")
        stored = hashes.get(challenge_id)
        checked += 1
        if (
            match is None
            or stored is None
            or code_digest(pepper, challenge_id, match.group(1)) != stored
        ):
            mismatched += 1
    return checked, mismatched


def history_account(send: SendStory) -> HistoryAccount:
    """The copies a row's history accounts for, and its life in the trace's words."""
    attempts = send.attempts
    return HistoryAccount(
        sent=sum(1 for a in attempts if a.outcome == Event.SENT),
        late_accepted=sum(1 for a in attempts if a.late is not None and a.late.accepted),
        vanished=tuple(a.worker_id or "?" for a in attempts if a.vanished),
        ambiguous=sum(1 for a in attempts if a.outcome == Event.AMBIGUOUS),
        story=chronicle(send),
    )


async def duplicate_histories(
    conn: psycopg.AsyncConnection[Any],
    rows: list[OutboxRow],
    copies: list[ReceivedMessage],
    schema: str,
) -> dict[int, HistoryAccount]:
    """The history accounts of the rows the server received more than once."""
    counts = Counter(copy.delivery_key for copy in copies if copy.delivery_key)
    ids = [row.id for row in rows if counts[row.delivery_key] > 1]
    records = await read_traces_async(conn, ids, schema=schema)
    stories = (
        build_story(
            row,
            [r for r in records.receipts if r.outbox_id == row.id],
            [e for e in records.events if e.outbox_id == row.id],
        )
        for row in records.rows
    )
    return {story.outbox_id: history_account(story) for story in stories}


async def gather_evidence(
    conn: psycopg.AsyncConnection[Any],
    log: EvidenceLog,
    record: ClientRecord,
    sink: SmtpSink,
    totals: dict[str, float],
    api: OtpApiSettings,
    *,
    scenario: str,
    wall_seconds: float,
    outbox_schema: str = "leasebox",
    sla: SlaAccount | None = None,
) -> Evidence:
    cur = await conn.execute(query("audit_outbox", outbox_schema, DEMO_SQL))
    rows = [OutboxRow(*row) for row in await cur.fetchall()]
    cur = await conn.execute(query("list_challenges", api.schema, SQL_FILE))
    challenges = {str(cid): (int(outbox_id), str(h)) for cid, outbox_id, h in await cur.fetchall()}
    received = sink.received
    checked, mismatched = check_codes(
        received, {cid: h for cid, (_, h) in challenges.items()}, api.pepper
    )
    accepted = {cid: challenges.get(cid, (-1, ""))[0] for cid in record.challenges}
    histories = await duplicate_histories(conn, rows, received, outbox_schema)
    return Evidence(
        accepted=accepted,
        rows=rows,
        copies=[Copy(m.delivery_key or m.message_id, m.message_id) for m in received],
        kills=list(log.kills),
        histories=histories,
        lease_lost_reported=int(totals["lease_lost"]),
        retries=int(totals["retries"]),
        transient_rejections=sink.transient_rejections,
        expected_dead_recipients=frozenset({REJECTED_ADDRESS}),
        expected_suppressed_recipients=frozenset({BOUNCING_ADDRESS}),
        bounce_answer=log.bounce_answer,
        api=ApiStats(
            requests=record.requests,
            created=record.created,
            replayed=record.replayed,
            replay_mismatches=record.replay_mismatches,
            errors=record.errors,
            checks=dict(record.checks),
        ),
        scaling=list(log.scaling),
        codes_checked=checked,
        codes_mismatched=mismatched,
        wall_seconds=wall_seconds,
        scenario=scenario,
        sla=sla,
    )
