"""`pip install leasebox` is the producer library alone, and it enqueues on real PostgreSQL.

The wheel is built from this checkout and installed, without extras, into a fresh virtual
environment; nothing of the worker's or the operator's dependencies may come with it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    *("aiohttp", "aiosmtplib", "jinja2", "prometheus_client", "psycopg_pool", "kopf", "yaml"),
    *("sqlalchemy", "asyncpg", "django", "botocore", "aiobotocore"),
    *("uvicorn", "dns", "disposable_email_domains"),
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding `pip install leasebox` and nothing more."""
    where = tmp_path_factory.mktemp("bare")
    wheels = where / "wheels"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(ROOT)),
        ],
        check=True,
        timeout=600,
    )
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    [wheel] = wheels.glob("leasebox-*.whl")
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        timeout=900,
    )
    return venv


def _python(venv: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=venv,
    )


def test_the_bare_install_brings_none_of_the_worker_or_operator_dependencies(
    bare_venv: Path,
) -> None:
    result = _python(
        bare_venv,
        """
        import importlib.util, json, sys
        import leasebox
        names = sys.argv[1:]
        print(json.dumps({
            "installed": [n for n in names if importlib.util.find_spec(n) is not None],
            "imported": [n for n in names if n in sys.modules],
        }))
        """,
        *HEAVY,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"installed": [], "imported": []}


def test_the_bare_install_enqueues_in_the_callers_transaction(
    bare_venv: Path, db_dsn: str, db_conn: psycopg.Connection
) -> None:
    result = _python(
        bare_venv,
        """
        import sys
        import psycopg
        import leasebox
        LINK = {"link": "https://example.com/v/1"}
        with psycopg.connect(sys.argv[1]) as conn:
            receipt = leasebox.enqueue(
                conn,
                leasebox.OutboxMessage(kind="verification", recipient="ada@example.com", data=LINK),
                idempotency_key="signup-1",
            )
            again = leasebox.enqueue(
                conn,
                leasebox.OutboxMessage(kind="verification", recipient="ada@example.com", data=LINK),
                idempotency_key="signup-1",
            )
        print(receipt.outbox_id, again.outbox_id, again.reused)
        """,
        db_dsn,
    )
    assert result.returncode == 0, result.stderr
    first, second, reused = result.stdout.split()
    assert (first, reused) == (second, "True")
    row = db_conn.execute(
        "SELECT kind, recipient, status FROM leasebox.messages WHERE id = %s", (int(first),)
    ).fetchone()
    assert row == ("verification", "ada@example.com", "pending")


def test_a_worker_command_without_its_extra_names_the_extra_to_install(
    bare_venv: Path, db_dsn: str
) -> None:
    result = subprocess.run(
        [str(bare_venv / "bin" / "leasebox"), "worker", "--dsn", db_dsn, "--provider", "null://"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'leasebox[worker]'" in result.stderr
    assert "Traceback" not in result.stderr
