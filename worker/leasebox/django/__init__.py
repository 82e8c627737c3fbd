"""Enqueue from Django: `leasebox.django.enqueue(message, ..., using="default")`.

Add `"leasebox.django"` to `INSTALLED_APPS` (installed with `leasebox[django]`); `migrate`
creates the outbox tables and `leasebox.django.enqueue` writes inside the caller's
`transaction.atomic()`. The app itself lives in `leasebox.producer.django`.
"""

from leasebox.producer.django.conf import LeaseboxSettings, read_settings
from leasebox.producer.django.enqueue import enqueue

__all__ = ["LeaseboxSettings", "enqueue", "read_settings"]
