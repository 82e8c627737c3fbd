"""Create leasebox's tables when the project runs `manage.py migrate` (and in test databases).

The SQL is leasebox's own (`leasebox.db.migrations`), applied on a connection of its own and
recorded in `<schema>.schema_migrations`, so running it again, or after `leasebox migrate`,
applies nothing. Each later leasebox migration ships with a Django migration like this one
(a test keeps the two in step). Reversing leaves the tables in place: they hold messages.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

# The last leasebox SQL migration this Django migration brings the schema to.
LEASEBOX_VERSION = 1


def forwards(apps: Any, schema_editor: Any) -> None:
    from leasebox.django.schema import apply_schema

    apply_schema(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False
    initial = True
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
