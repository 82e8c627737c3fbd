"""The states of an outbox row, the reasons a row becomes a dead letter, and the history's events.

The SQL writes these values as literals (`status = 'pending'`); Python names them here, and
a test checks that both agree with the schema's CHECK constraint and with every literal the
queries use. Each state says what moves a row into it and what moves it out:

    pending --claim--> processing --sent (lease token matches)--> sent
       ^                   |  \\--permanent error / attempts exhausted / expired--> dead
       |                   |--transient error--> pending (available_at = now + backoff)
       |                   |--lease released or expired--> pending (or dead, out of attempts)
       |                   \\--a newer message of its key, seen before the wire--> superseded
       |--a newer message of its replacement key committed--> superseded
       \\--claim finds the address suppressed, or the provider refuses it as such--> suppressed
    dead --requeue (a person: `leasebox dead-letters requeue`)--> pending
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Where a row is in its life; the `status` column."""

    PENDING = "pending"
    """Waiting for a worker. Claimable once `available_at` has passed (a retry waits out its
    backoff here). Leaves by a claim (to `processing`) or, for a row past its `expires_at`,
    by the expiry sweep (to `dead`, reason `expired`)."""

    PROCESSING = "processing"
    """Leased by one worker until `lease_expires_at`; only the holder of `lease_token` may
    settle it. Leaves when the holder records the outcome (`sent`, `pending` for a retry,
    `dead`), releases the lease unsent on shutdown (`pending`), or when another worker
    reclaims the expired lease (`pending`, or `dead` once out of attempts)."""

    SENT = "sent"
    """The provider accepted the message. Final; `leasebox prune` deletes the row after the
    retention."""

    DEAD = "dead"
    """Not sent and not going to be without a person: see `dead_reason`. Leaves only by
    `leasebox dead-letters requeue` (to `pending`, fresh attempts) or `purge` (deleted)."""

    SUPERSEDED = "superseded"
    """Replaced by a newer message of its replacement key ("resend code") before it was
    written to the wire: by the producer's transaction while pending, or by the worker's
    check right before the wire while processing. Final, neither retried nor a dead letter;
    like `sent`, its row has left the queue and its history names the newer message."""
    SUPPRESSED = "suppressed"
    """Not sent, for good: the address was on the suppression list when a worker claimed it
    (no attempt is spent), or the provider refused it as one it suppresses. Final, neither
    retried nor a dead letter; like `sent` it leaves the queue (the `messages` view and the
    history's `suppressed` row say it)."""


class DeadReason(StrEnum):
    """Why a row is a dead letter; the `dead_reason` column and a metric label."""

    REJECTED = "rejected"
    """The provider refused the message for good (SMTP 5xx, HTTP 4xx other than 408/429)."""

    INVALID_MESSAGE = "invalid_message"
    """The message cannot be built: its template is missing or lacks a variable."""

    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    """Every attempt failed transiently, or its workers kept dying while holding it."""

    EXPIRED = "expired"
    """Its `expires_at` passed before it could be written to the wire: never sent late."""

    POSSIBLY_DELIVERED = "possibly_delivered"
    """Out of attempts, the last one ambiguous (the provider took the message and never
    answered, or the send was cut short after it was handed over): it may have been
    delivered. Check with the provider before requeueing it."""


class Event(StrEnum):
    """What happened to a row, one `history` row each; the history's `event` column.

    A claim and the event that ended its lease share a `lease_token`; `lease_lost` is the
    report of a worker that settled after its lease had ended, `expired` and `requeued` are
    transitions outside any lease, and `superseded` ends a lease or happens outside one.
    `suppressed` ends a message at its claim (no lease is taken) or, when the provider
    refused the address, ends the lease of that attempt."""

    CLAIMED = "claimed"
    SENT = "sent"
    RETRY = "retry"
    AMBIGUOUS = "ambiguous"
    DEAD = "dead"
    RELEASED = "released"
    LEASE_EXPIRED = "lease_expired"
    LEASE_LOST = "lease_lost"
    EXPIRED = "expired"
    REQUEUED = "requeued"
    SUPERSEDED = "superseded"
    SUPPRESSED = "suppressed"
