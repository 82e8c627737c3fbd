"""leasebox: a transactional outbox for OTP and verification emails on PostgreSQL.

Producers call `enqueue` inside their own transaction; workers (`leasebox worker`) deliver
with leases; the operator (`leasebox operator`) scales workers to an SLA.
"""

from leasebox.errors import (
    BatchConflict,
    ConfigurationError,
    DatabaseUnavailable,
    IdempotencyConflict,
    LeaseboxError,
    NotMigrated,
    PayloadKeyError,
    RateLimited,
    RecipientRefused,
    RecipientSuppressed,
)
from leasebox.messages import OutboxMessage, Receipt
from leasebox.producer.batch import enqueue_many, enqueue_many_async
from leasebox.producer.enqueue import enqueue, enqueue_async
from leasebox.producer.guard import AbuseGuard
from leasebox.producer.recipients import RecipientPolicy
from leasebox.store.suppressions import remove_suppression as lift_suppression
from leasebox.store.suppressions import remove_suppression_async as lift_suppression_async
from leasebox.version import __version__

__all__ = [
    "AbuseGuard",
    "BatchConflict",
    "ConfigurationError",
    "DatabaseUnavailable",
    "IdempotencyConflict",
    "LeaseboxError",
    "NotMigrated",
    "OutboxMessage",
    "PayloadKeyError",
    "RateLimited",
    "Receipt",
    "RecipientPolicy",
    "RecipientRefused",
    "RecipientSuppressed",
    "__version__",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "lift_suppression",
    "lift_suppression_async",
]
