"""Pruning history: sent rows and expired receipts older than a retention, in batches.

Sent rows and expired receipts are history that the queue tables should not carry forever.
Each batch is its own short transaction, so pruning runs beside busy workers.

History is also what makes a retried request the same send: a live receipt, or a row with an
explicit delivery key. So a sent row that a live receipt references is never pruned (and a
row that goes takes its receipts with it, by the foreign key, and its attempt history, by
the same statement), and a retention shorter than the producers' receipt TTL is refused
unless the caller says it knows: a request retried after its row was pruned is a new
request, and sends again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from leasebox.db.queries import DEFAULT_SCHEMA, query
from leasebox.errors import ConfigurationError
from leasebox.messages import DEFAULT_RECEIPT_TTL_SECONDS


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
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS,
    allow_short_retention: bool = False,
) -> PruneResult:
    """Delete sent rows and expired receipts older than the retention, batch by batch.

    `receipt_ttl_seconds` is the longest receipt TTL the producers use; a shorter retention
    is a `ConfigurationError` unless `allow_short_retention`.
    """
    if retention_seconds < 0:
        raise ConfigurationError("the retention must not be negative")
    if retention_seconds < receipt_ttl_seconds and not allow_short_retention:
        raise ConfigurationError(
            f"a retention of {_duration(retention_seconds)} is shorter than the receipt TTL "
            f"({_duration(receipt_ttl_seconds)}): a request retried after its row was pruned "
            "would be sent again; give the producers' TTL (--receipt-ttl) or allow it "
            "(--allow-short-retention)"
        )
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


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
