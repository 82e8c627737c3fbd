"""Keeping the leases this worker holds: what it holds, and extending leases of slow sends.

A lease that runs out while its send is still running lets another worker take the row and
send it again, so every held lease with less than half its time left is extended, all in one
statement, on the token. A lease that cannot be extended is lost (the row was reclaimed): it
is marked, so that a row still waiting for a send slot is released instead of sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from leasebox.db.connections import STATEMENT_TIMEOUT
from leasebox.runtime.logs import message_fields
from leasebox.runtime.settings import WorkerSettings
from leasebox.store import claiming
from leasebox.store.claiming import ClaimedMessage, LeaseRef

log = logging.getLogger("leasebox.worker")


@dataclass(slots=True)
class Held:
    """A claimed row this worker still holds, with its lease deadline on the local clock.

    The deadline is counted from before the claim was sent, so it never ends later than the
    lease in the database does.
    """

    message: ClaimedMessage
    claimed_at: float
    deadline: float
    lost: bool = False
    handed_over: bool = False
    """The provider passed its last check before writing the message (`Email.expired`): a
    send cancelled from then on may have reached it."""
    # The newer message of its replacement key, once a check before the wire found one.
    superseded_by: int | None = None

    @property
    def lease(self) -> LeaseRef:
        return LeaseRef(self.message.id, self.message.lease_token)


async def extend_due_leases(
    pool: AsyncConnectionPool,
    held: Mapping[int, Held],
    settings: WorkerSettings,
    now: datetime | None,
) -> None:
    """Extend, in one statement, every held lease with less than half its time left.

    A lease that cannot be extended is lost (the row was reclaimed): it is marked so that a
    row still waiting for a send slot is not sent.
    """
    started = time.monotonic()
    due = [
        h for h in held.values() if not h.lost and h.deadline - started < settings.lease_seconds / 2
    ]
    if not due:
        return
    async with asyncio.timeout(STATEMENT_TIMEOUT), pool.connection() as conn:
        kept = await claiming.extend_leases(
            conn,
            [h.lease for h in due],
            lease_seconds=settings.lease_seconds,
            schema=settings.schema,
            now=now,
        )
    for entry in due:
        if entry.message.id in kept:
            entry.deadline = started + settings.lease_seconds
        elif entry.message.id in held:
            entry.lost = True
            log.warning("lease could not be extended: lost", extra=message_fields(entry.message))
