"""The web tests' outbox: a database filled once per module by a real worker (read-only tests
share it; a test that acts gets its own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

from support.web_rig import Seeded, seeded_outbox


@pytest.fixture(scope="module")
def web_seeded(server_dsn: str, template_dsn: str) -> Iterator[tuple[str, Seeded]]:
    """A migrated database of this module's own, seeded by `seeded_outbox`: (DSN, ids)."""
    template = str(conninfo.conninfo_to_dict(template_dsn)["dbname"])
    name = f"leasebox_web_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    params = conninfo.conninfo_to_dict(server_dsn)
    params["dbname"] = name
    dsn = conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
    try:
        yield dsn, seeded_outbox(dsn)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
