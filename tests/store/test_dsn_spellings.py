"""One `DATABASE_URL` serves an application's SQLAlchemy engine and leasebox.

SQLAlchemy spells the driver in the scheme (`postgresql+psycopg://`, `postgresql+asyncpg://`)
and asyncpg says `ssl=` where libpq says `sslmode=`; leasebox reads both wherever it takes a
DSN: the command line (flag, `LEASEBOX_DSN`, `DATABASE_URL`), the worker, `migrate()` and the
operator's Secret (in `tests/operator/test_database_source.py`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

import leasebox
import leasebox.sqlalchemy
from leasebox.db.connections import libpq_dsn, redact_dsn
from leasebox.db.migrations import migrate
from leasebox.errors import ConfigurationError
from support.orm_producers import sqlalchemy_url

LEASEBOX = [sys.executable, "-m", "leasebox"]


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("postgresql+psycopg://app:pw@db:5432/app", "postgresql://app:pw@db:5432/app"),
        ("postgresql+asyncpg://app@db/app", "postgresql://app@db/app"),
        ("postgres+psycopg2://app@db/app", "postgresql://app@db/app"),
        ("POSTGRESQL+ASYNCPG://app@db/app", "postgresql://app@db/app"),
        (
            "postgresql+asyncpg://app@db/app?ssl=require&application_name=x",
            "postgresql://app@db/app?sslmode=require&application_name=x",
        ),
        ("postgresql+asyncpg://app@db/app?ssl=true", "postgresql://app@db/app?sslmode=require"),
        ("postgresql+asyncpg://app@db/app?ssl=false", "postgresql://app@db/app?sslmode=disable"),
        (
            "postgresql+psycopg://app@db/app?sslmode=verify-full",
            "postgresql://app@db/app?sslmode=verify-full",
        ),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
        ("host=db dbname=app user=app", "host=db dbname=app user=app"),
    ],
)
def test_sqlalchemy_spellings_become_what_libpq_reads(given: str, read: str) -> None:
    assert libpq_dsn(given) == read


def test_an_unknown_asyncpg_ssl_value_is_one_line_without_the_password() -> None:
    with pytest.raises(ConfigurationError, match="ssl option must be one of") as caught:
        libpq_dsn("postgresql+asyncpg://app:s3cret@db/app?ssl=maybe")
    assert "s3cret" not in str(caught.value)
    assert redact_dsn("postgresql+asyncpg://app:s3cret@db/app") == (
        "user=app password=*** dbname=app host=db"
    )


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LEASEBOX, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def clean_environment(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LEASEBOX_DSN", "DATABASE_URL")}
    return {**env, **variables}


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_the_commands_take_a_sqlalchemy_url_as_flag_and_as_variable(
    empty_db_dsn: str, driver: str
) -> None:
    url = sqlalchemy_url(empty_db_dsn, driver)
    migrated = run("migrate", "--dsn", url, env=clean_environment())
    status = run("status", "--json", env=clean_environment(DATABASE_URL=url))
    assert migrated.returncode == 0, migrated.stderr
    assert "applied 0001_initial" in migrated.stdout
    assert status.returncode == 0, status.stderr


def test_migrate_takes_a_sqlalchemy_url(empty_db_dsn: str) -> None:
    assert migrate(sqlalchemy_url(empty_db_dsn, "psycopg"))
    assert migrate(sqlalchemy_url(empty_db_dsn, "asyncpg")) == []


async def test_one_database_url_serves_the_apps_engine_and_the_worker(db_dsn: str) -> None:
    url = sqlalchemy_url(db_dsn, "asyncpg")  # what the application's DATABASE_URL holds
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await leasebox.sqlalchemy.enqueue_async(
                conn,
                leasebox.OutboxMessage(
                    kind="verification",
                    recipient="ada@example.com",
                    data={"link": "https://example.com/v/1"},
                ),
            )
    finally:
        await engine.dispose()
    worker = run(
        *("worker", "--provider", "null://", "--drain", "--metrics-port", "0"),
        env=clean_environment(DATABASE_URL=url),
    )
    assert worker.returncode == 0, worker.stderr
    with psycopg.connect(db_dsn) as conn:
        rows: list[Any] = conn.execute("SELECT status FROM leasebox.messages").fetchall()
    assert rows == [("sent",)]
