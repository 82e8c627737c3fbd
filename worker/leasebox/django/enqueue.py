"""`leasebox.django.enqueue`: the producer plan run on the Django connection of a transaction.

The statements go through Django's own cursor, so they run on the connection and inside the
transaction that `transaction.atomic()` (or `ATOMIC_REQUESTS`) opened for the business
change, and they show up in Django's query logging like any other. Outside an atomic block
Django commits every statement on its own, which would publish the row before the change it
belongs to, so that is refused with Django's own `TransactionManagementError`.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.transaction import TransactionManagementError

from leasebox.catalogue import Catalogue
from leasebox.django.conf import read_settings
from leasebox.errors import ConfigurationError
from leasebox.messages import OutboxMessage, Receipt
from leasebox.producer.enqueue import plan_enqueue
from leasebox.producer.guard import AbuseGuard
from leasebox.producer.payload_crypto import PayloadCipher
from leasebox.producer.plan import Row
from leasebox.producer.portable import drive, statement_text
from leasebox.producer.recipients import RecipientPolicy


def enqueue(
    message: OutboxMessage,
    *,
    idempotency_key: str | None = None,
    scope: str | None = None,
    request_hash: str | None = None,
    guard: AbuseGuard | None = None,
    receipt_ttl_seconds: float | None = None,
    schema: str | None = None,
    cipher: PayloadCipher | None = None,
    catalogue: Catalogue | None = None,
    check_suppression: bool = False,
    policy: RecipientPolicy | None = None,
    using: str | None = None,
) -> Receipt:
    """`leasebox.enqueue` inside the current `transaction.atomic()` of connection `using`.

    Unset arguments come from `settings.LEASEBOX` (`schema`, `guard`, the receipt TTL, the
    payload keys, and the connection alias `DATABASE`, by default `"default"`). The row
    commits or rolls back with the atomic block; nothing here commits.
    """
    configured = read_settings()
    alias = using or configured.database
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ConfigurationError(
            f"leasebox needs PostgreSQL; the Django connection {alias!r} is {connection.vendor}"
        )
    if not connection.in_atomic_block:
        raise TransactionManagementError(
            "leasebox.django.enqueue must run inside transaction.atomic() (or with "
            "ATOMIC_REQUESTS), so that the outbox row commits with your change"
        )
    if policy is not None:
        policy.check(message.recipient)
    chosen_schema = schema or configured.schema
    plan = plan_enqueue(
        message,
        idempotency_key=idempotency_key,
        scope=scope,
        request_hash=request_hash,
        guard=guard if guard is not None else configured.guard,
        receipt_ttl_seconds=(
            receipt_ttl_seconds
            if receipt_ttl_seconds is not None
            else configured.receipt_ttl_seconds
        ),
        cipher=cipher or configured.cipher(),
        catalogue=catalogue,
        check_suppression=check_suppression,
    )
    with connection.cursor() as cursor:

        def execute(name: str, params: dict[str, Any]) -> Row:
            cursor.execute(statement_text(name, chosen_schema), params)
            found = cursor.fetchone()
            if found is None:
                return None
            return {
                column.name: value for column, value in zip(cursor.description, found, strict=True)
            }

        return drive(plan, execute)
