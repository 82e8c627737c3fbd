"""Applying leasebox's own migrations to a Django database, outside Django's transactions.

leasebox's migrations take an advisory lock and run each file in its own transaction
(`leasebox.db.migrations`), so they get a psycopg connection of their own, opened with the
parameters of the Django connection: the same server, database, user and options.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections

from leasebox.db.migrations import Migration, migrate
from leasebox.django.conf import read_settings
from leasebox.errors import ConfigurationError


def connection_parameters(alias: str) -> dict[str, Any]:
    """psycopg connection parameters of the Django connection `alias`."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ConfigurationError(
            f"leasebox needs PostgreSQL; the Django connection {alias!r} is {connection.vendor}"
        )
    params = dict(connection.get_connection_params())
    # Django's cursor class and adapters belong to its own connections, not to this one.
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return params


def apply_schema(alias: str | None = None, schema: str | None = None) -> list[Migration]:
    """Apply every leasebox migration not yet applied; return the ones applied now."""
    configured = read_settings()
    params = connection_parameters(alias or configured.database)
    with psycopg.connect(autocommit=True, **params) as conn:
        return migrate(conn, schema or configured.schema)
