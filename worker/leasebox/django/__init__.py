"""Enqueue from Django: the outbox row commits inside the caller's `transaction.atomic()`.

Add `"leasebox.django"` to `INSTALLED_APPS` (installed with `leasebox[django]`; the app's
label is `leasebox`); `python manage.py migrate` then creates leasebox's tables (and
`manage.py leasebox_migrate` upgrades them on its own), and `leasebox.django.enqueue(message,
...)` writes on the Django connection of the current transaction. Settings come from
`settings.LEASEBOX` or `LEASEBOX_*` variables (`conf`).
"""

from leasebox.django.conf import LeaseboxSettings, read_settings
from leasebox.django.enqueue import enqueue

__all__ = ["LeaseboxSettings", "enqueue", "read_settings"]
