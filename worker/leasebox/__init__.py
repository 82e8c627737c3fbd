"""leasebox: a transactional outbox for OTP and verification emails on PostgreSQL.

Producers call `enqueue` inside their own transaction; workers (`leasebox worker`) deliver
with leases; the operator (`leasebox operator`) scales workers to an SLA.
"""

from leasebox.catalogue import Catalogue, TemplateSpec, register_kind, register_template
from leasebox.db.connections import libpq_dsn
from leasebox.errors import (
    AlreadyExpired,
    BatchConflict,
    ConfigurationError,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidMessage,
    InvalidRequest,
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
    "AlreadyExpired",
    "BatchConflict",
    "Catalogue",
    "ConfigurationError",
    "DatabaseUnavailable",
    "IdempotencyConflict",
    "InvalidMessage",
    "InvalidRequest",
    "LeaseboxError",
    "NotMigrated",
    "OutboxMessage",
    "PayloadKeyError",
    "RateLimited",
    "Receipt",
    "RecipientPolicy",
    "RecipientRefused",
    "RecipientSuppressed",
    "TemplateSpec",
    "__version__",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "libpq_dsn",
    "lift_suppression",
    "lift_suppression_async",
    "register_kind",
    "register_template",
]
