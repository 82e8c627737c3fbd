"""Collecting the demo's evidence from its three witnesses, after the traffic has drained.

The clients know which challenges the API confirmed, the outbox knows what it did with each
row, and the SMTP server knows what it received. None of them is trusted alone: the verdict
in `demo_report` compares them. This module only reads them into plain values, and checks
that every delivered code matches the hash its challenge stored, which shows that a secret
encrypted at rest in the outbox reached the user intact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import psycopg

from leasebox.db.queries import SqlFile, query
from leasebox.demo.otp_api import SQL_FILE, OtpApiSettings, code_digest
from leasebox.demo.report import (
    ApiStats,
    Copy,
    Evidence,
    Kill,
    OutboxRow,
    ScalingEvent,
)
from leasebox.demo.scenario import REJECTED_ADDRESS, ClientRecord
from leasebox.testing.smtp_sink import ReceivedMessage, SmtpSink

_CODE_LINE = re.compile(r"^\s+(\d{4,12})\s*$", re.MULTILINE)

DEMO_SQL = SqlFile("leasebox.demo", "demo.sql")


@dataclass
class EvidenceLog:
    """What the control loop noticed while the run went on."""

    kills: list[Kill] = field(default_factory=list)
    scaling: list[ScalingEvent] = field(default_factory=list)
    lease_lost_ids: set[int] = field(default_factory=set)
    unfinished: int = -1  # rows pending or processing at the last look; -1 before the first


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
    return Evidence(
        accepted=accepted,
        rows=rows,
        copies=[Copy(m.delivery_key or m.message_id, m.message_id) for m in received],
        kills=list(log.kills),
        lease_lost_ids=frozenset(log.lease_lost_ids),
        lease_lost_reported=int(totals["lease_lost"]),
        retries=int(totals["retries"]),
        transient_rejections=sink.transient_rejections,
        expected_dead_recipients=frozenset({REJECTED_ADDRESS}),
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
    )
