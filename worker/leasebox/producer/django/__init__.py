"""Enqueue from Django: the outbox row commits inside the caller's `transaction.atomic()`.

Add `"leasebox.django"` to `INSTALLED_APPS`; `python manage.py migrate` then creates
leasebox's tables (and `manage.py leasebox_migrate` upgrades them on its own), and
`leasebox.django.enqueue(message, ...)` writes on the Django connection of the current
transaction. Settings come from `settings.LEASEBOX` or `LEASEBOX_*` variables (`conf`).
"""
