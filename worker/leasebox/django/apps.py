"""Where Django finds the app config when `INSTALLED_APPS` names `leasebox.django`."""

from leasebox.producer.django.apps import LeaseboxConfig

__all__ = ["LeaseboxConfig"]
