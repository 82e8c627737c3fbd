"""The Django app: its label, and a system check that reads leasebox's settings at start-up."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class LeaseboxConfig(AppConfig):
    """`INSTALLED_APPS = [..., "leasebox.django"]` installs this app (label `leasebox`)."""

    name = "leasebox.django"
    # Django records the app's migrations under its label, not its module: the label stays
    # `leasebox` wherever the module lives, so a database migrated before needs nothing.
    label = "leasebox"
    verbose_name = "leasebox transactional outbox"
    default = True

    def ready(self) -> None:
        checks.register(check_settings, checks.Tags.compatibility)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check`: a malformed `settings.LEASEBOX` is an error before any request."""
    from leasebox.django.conf import read_settings

    try:
        read_settings()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="leasebox.E001")]
    return []
