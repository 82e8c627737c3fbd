"""Applying the ordered migrations, safely from many pods at once.

Every worker and operator pod may run `leasebox migrate` on start. A session-level advisory
lock serialises them; each migration runs in its own transaction and is recorded, so a
second run (or a run that lost the race) applies nothing. Migrating ends with the partition
maintenance (`leasebox.db.partitions`), so a migrated schema has its days ready.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from leasebox.db.partitions import ensure_partitions
from leasebox.db.queries import compose, read_sql_file, validate_schema_name

_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# A fixed, project-specific key; derived from the schema so two schemas migrate in parallel.
_LOCK_SQL = "SELECT pg_advisory_lock(hashtextextended('leasebox.migrate.' || %s, 0))"
_UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtextextended('leasebox.migrate.' || %s, 0))"


@dataclass(frozen=True)
class Migration:
    """One ordered migration file."""

    version: int
    name: str
    filename: str

    def text(self) -> str:
        return read_sql_file(f"migrations/{self.filename}")


def available_migrations() -> list[Migration]:
    """The migrations shipped with this version, in order."""
    folder = resources.files("leasebox.db").joinpath("sql", "migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.name))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must be 1..n without gaps, found {versions}")
    return found


def expected_schema_version() -> int:
    """The schema version this release needs: its newest migration."""
    return max((m.version for m in available_migrations()), default=0)


def applied_versions(conn: psycopg.Connection, schema: str) -> set[int]:
    """Versions recorded as applied (empty when leasebox was never migrated)."""
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".schema_migrations',)
    ).fetchone()
    if not exists or not exists[0]:
        return set()
    rows = conn.execute(compose("SELECT version FROM {schema}.schema_migrations", schema))
    return {int(r[0]) for r in rows}


def pending_migrations(conn: psycopg.Connection, schema: str) -> list[Migration]:
    """The migrations of this release not yet applied to `schema`, in order (all of them
    for a schema that does not exist); reads only."""
    validate_schema_name(schema)
    done = applied_versions(conn, schema)
    return [m for m in available_migrations() if m.version not in done]


def migrate(dsn_or_conn: str | psycopg.Connection, schema: str = "leasebox") -> list[Migration]:
    """Apply every migration not yet applied; return the ones this call applied."""
    validate_schema_name(schema)
    if isinstance(dsn_or_conn, str):
        from leasebox.db.connections import connect

        with connect(dsn_or_conn, autocommit=True) as conn:
            return _migrate(conn, schema)
    if not dsn_or_conn.autocommit:
        raise ValueError("migrate() needs an autocommit connection (it manages transactions)")
    return _migrate(dsn_or_conn, schema)


def _migrate(conn: psycopg.Connection, schema: str) -> list[Migration]:
    conn.execute(_LOCK_SQL, (schema,))
    try:
        with conn.transaction():
            conn.execute(compose("CREATE SCHEMA IF NOT EXISTS {schema}", schema))
            conn.execute(
                compose(
                    "CREATE TABLE IF NOT EXISTS {schema}.schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())",
                    schema,
                )
            )
        done = applied_versions(conn, schema)
        applied = []
        for migration in available_migrations():
            if migration.version in done:
                continue
            with conn.transaction():
                conn.execute(compose(migration.text(), schema))
                conn.execute(
                    compose(
                        "INSERT INTO {schema}.schema_migrations (version, name) VALUES (%s, %s)",
                        schema,
                    ),
                    (migration.version, migration.name),
                )
            applied.append(migration)
        ensure_partitions(conn, schema)
        return applied
    finally:
        conn.execute(_UNLOCK_SQL, (schema,))


def apply_canonical_schema(conn: psycopg.Connection, schema: str = "leasebox") -> None:
    """Create the schema straight from `schema.sql`, with its partitions (tests compare it
    with the migrations); `conn` must be in autocommit mode."""
    with conn.transaction():
        conn.execute(compose(read_sql_file("schema.sql"), schema))
    ensure_partitions(conn, schema)
