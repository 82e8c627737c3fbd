"""Bring leasebox's tables to its SQL migration 0008 (`0008_operations`: the audit trail, an
index of failed attempts, the enqueuing request's trace context).

Like every Django migration of this app it applies whatever leasebox SQL migrations are
missing, on a connection of its own; each is named after the leasebox migration it brings
the schema to.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

# The last leasebox SQL migration this Django migration brings the schema to.
LEASEBOX_VERSION = 8


def forwards(apps: Any, schema_editor: Any) -> None:
    from leasebox.django.schema import apply_schema

    apply_schema(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("leasebox", "0007_leasebox_schema")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
