"""Bring leasebox's tables to its tenth SQL migration (`0010_receipt_lookup_by_index`).

Like every Django migration of this app it applies whatever leasebox SQL migrations are
missing, on a connection of its own; one ships with each leasebox migration so that
`manage.py migrate` upgrades the tables of a project that has applied the previous one.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

# The last leasebox SQL migration this Django migration brings the schema to.
LEASEBOX_VERSION = 10


def forwards(apps: Any, schema_editor: Any) -> None:
    from leasebox.django.schema import apply_schema

    apply_schema(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("leasebox", "0009_leasebox_schema")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
