"""Pruning history: sent rows and expired receipts older than a retention, in batches.

Sent rows and expired receipts are history that the queue tables should not carry forever.
Each batch is its own short transaction, so pruning runs beside busy workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from leasebox.db.queries import DEFAULT_SCHEMA, query
from leasebox.errors import ConfigurationError


@dataclass(frozen=True)
class PruneResult:
    """How many sent rows and receipts one `prune` deleted."""

    sent: int
    receipts: int


def prune(
    conn: psycopg.Connection[Any],
    *,
    retention_seconds: float,
    batch_size: int = 5000,
    schema: str = DEFAULT_SCHEMA,
) -> PruneResult:
    """Delete sent rows and expired receipts older than the retention, batch by batch."""
    if retention_seconds < 0:
        raise ConfigurationError("the retention must not be negative")
    if batch_size < 1:
        raise ConfigurationError("the batch size must be at least 1")
    params = {"retention_seconds": retention_seconds, "limit": batch_size}
    totals = []
    for name in ("prune_sent", "prune_receipts"):
        total = 0
        while True:
            count = conn.execute(query(name, schema), params).rowcount
            conn.commit()
            total += max(count, 0)
            if count < batch_size:
                break
        totals.append(total)
    return PruneResult(sent=totals[0], receipts=totals[1])
