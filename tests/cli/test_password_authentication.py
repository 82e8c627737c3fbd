"""A wrong database password is one clear line that never shows a password, against a real
PostgreSQL that requires SCRAM-SHA-256 password authentication (not the trusting test one)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from leasebox.cli.main import EXIT_RUNTIME
from leasebox.testing.embedded import EmbeddedPostgres

ROOT = Path(__file__).resolve().parents[2]
RIGHT = "right-" + secrets.token_hex(6)
WRONG = "wrong-" + secrets.token_hex(6)


@pytest.fixture(scope="module")
def scram_server() -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(ROOT / "build" / f"scram-pg-{os.getpid()}", password=RIGHT)
    try:
        server.start()
    except Exception as exc:  # the reason matters more than the type here
        if os.environ.get("CI"):
            pytest.fail(f"embedded PostgreSQL with password authentication did not start: {exc}")
        pytest.skip(f"embedded PostgreSQL did not start: {exc}")
    try:
        yield server
    finally:
        server.destroy()


def leasebox(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LEASEBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "leasebox", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environment,
    )


def test_the_server_really_requires_the_password(scram_server: EmbeddedPostgres) -> None:
    psycopg.connect(scram_server.dsn, connect_timeout=5).close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(scram_server.dsn.replace(RIGHT, WRONG), connect_timeout=5)


@pytest.mark.parametrize(
    "command",
    [["migrate"], ["status"], ["worker", "--provider", "null://"], ["dead-letters", "list"]],
    ids=lambda c: c[0],
)
def test_a_wrong_password_is_one_clear_line_without_any_password(
    scram_server: EmbeddedPostgres, command: list[str]
) -> None:
    dsn = scram_server.dsn.replace(RIGHT, WRONG)
    result = leasebox(*command, "--dsn", dsn)
    assert result.returncode == EXIT_RUNTIME  # the database refused: not a usage error
    assert result.stderr.splitlines() == [
        f"leasebox {command[0]}: error: cannot connect to PostgreSQL at "
        f"127.0.0.1:{scram_server.port}/postgres: password authentication failed for user "
        '"postgres"; check the user name and password in the DSN'
    ]
    assert WRONG not in result.stdout + result.stderr
    assert RIGHT not in result.stdout + result.stderr


def test_a_missing_password_says_that_the_server_wants_one(scram_server: EmbeddedPostgres) -> None:
    result = leasebox("migrate", "--dsn", scram_server.dsn.replace(f":{RIGHT}@", "@"))
    assert result.returncode == EXIT_RUNTIME  # the database refused: not a usage error
    assert result.stderr.strip().endswith(
        "no password supplied; the server requires a password and the DSN gives none"
    )
    assert len(result.stderr.splitlines()) == 1


def test_the_right_password_connects(scram_server: EmbeddedPostgres) -> None:
    result = leasebox("migrate", "--dsn", scram_server.dsn)
    assert result.returncode == 0, result.stderr
    assert RIGHT not in result.stdout + result.stderr
