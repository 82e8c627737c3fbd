"""`docs/quickstart.md` works as written: its commands run in a shell, its files are saved as
they read, against a real PostgreSQL, a real uvicorn, a real Django project and a real SMTP
server on loopback.

What the test changes is only where things are: the database URL, the service's port and the
SMTP server's address in a command are replaced by the test's own. The `pip install` lines
are not run (the test has what they install); their extras must exist and their packages
import.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from psycopg import conninfo

from leasebox.producer.payload_crypto import generate_key
from leasebox.testing.ports import free_port
from leasebox.testing.smtp_sink import SmtpSink
from support.orm_producers import sqlalchemy_url
from support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "quickstart.md").read_text("utf-8")
BLOCK = re.compile(r"<!-- quickstart: ([^>]+?) -->\n```[a-z]*\n(.*?)```", re.DOTALL)
BLOCKS: dict[str, str] = dict(BLOCK.findall(DOC))
DOC_URL = "postgresql+psycopg://app:secret@localhost:5432/app"
BIN = str(Path(sys.executable).parent)


def block(name: str) -> str:
    assert name in BLOCKS, f"docs/quickstart.md has no block {name!r}"
    return BLOCKS[name]


def commands(name: str) -> list[str]:
    """The block's command lines, without the `pip install` ones."""
    return [line for line in block(name).splitlines() if line and not line.startswith("pip ")]


def base_environment(**variables: str) -> dict[str, str]:
    """This process's environment without leasebox's variables, the venv's tools first."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LEASEBOX_DSN", "DATABASE_URL", "LEASEBOX_PAYLOAD_KEYS")
    }
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **variables}


def shell(lines: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Run `lines` in one bash, stopping at the first failure; its output and its final
    environment (what the lines exported)."""
    dump = cwd / ".environment"
    script = "\n".join(["set -euo pipefail", *lines, f"env -0 > {shlex.quote(str(dump))}"])
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, (
        f"{script}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    exported = dict(entry.split("=", 1) for entry in dump.read_text().split("\0") if "=" in entry)
    return result.stdout, exported


def save_file(name: str, directory: Path) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block(f"file {name}"))
    return path


@pytest.mark.parametrize("name", ["fastapi-setup", "django-setup"])
def test_the_install_lines_name_extras_and_packages_that_exist(name: str) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    [line] = [line for line in block(name).splitlines() if line.startswith("pip install")]
    for word in shlex.split(line)[2:]:
        if word.startswith("leasebox["):
            assert set(word[len("leasebox[") : -1].split(",")) <= set(extras), word
        else:
            __import__(word)


def test_the_fastapi_walkthrough_sends_its_first_email(empty_db_dsn: str, tmp_path: Path) -> None:
    url = sqlalchemy_url(empty_db_dsn, "psycopg")
    setup = [line.replace(DOC_URL, url) for line in commands("fastapi-setup")]
    assert any(DOC_URL in line for line in commands("fastapi-setup"))
    _, env = shell(setup, tmp_path, base_environment())
    assert env["DATABASE_URL"] == url
    assert env["LEASEBOX_PAYLOAD_KEYS"]
    save_file("app.py", tmp_path)

    port = free_port()
    [serve] = commands("fastapi-serve")
    with (tmp_path / "uvicorn.log").open("wb") as log:
        server = subprocess.Popen(
            [*shlex.split(serve), "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: server.poll() is not None or _answers(port),
            what="uvicorn to serve the app",
            timeout=60,
        )
        assert server.poll() is None, (tmp_path / "uvicorn.log").read_text()
        here = f"127.0.0.1:{port}"
        out, _ = shell(
            [line.replace("localhost:8000", here) for line in commands("fastapi-request")],
            tmp_path,
            env,
        )
        # curl prints each answer without a line end.
        answers = [json.loads(found) for found in re.findall(r"\{[^{}]*\}", out)]
        assert [a["reused"] for a in answers] == [False, True]
        assert answers[0]["outbox_id"] == answers[1]["outbox_id"]
        assert "leasebox log provider: accepted" in out
        assert "kind=verification" in out
        assert "to=*@example.com" in out
        assert "1 logical send from 2 requests" in out

        with SmtpSink() as sink:
            smtp = [
                line.replace("localhost:8000", here).replace(
                    "localhost:1025", f"{sink.host}:{sink.port}"
                )
                for line in commands("fastapi-smtp")
            ]
            shell(smtp, tmp_path, env)
            [received] = sink.received
        assert received.recipient == "grace@example.com"
        assert received.message_id.endswith("@acme.example>")
    finally:
        server.terminate()
        server.wait(timeout=30)


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_django_walkthrough_enqueues_in_the_transaction_and_the_worker_sends(
    empty_db_dsn: str, tmp_path: Path
) -> None:
    env = base_environment(LEASEBOX_PAYLOAD_KEYS=generate_key())
    subprocess.run(["django-admin", "startproject", "mysite", str(tmp_path)], env=env, check=True)
    params = conninfo.conninfo_to_dict(empty_db_dsn)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params["dbname"],
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": str(params.get("port", "")),
    }
    settings = tmp_path / "mysite" / "settings.py"
    with settings.open("a") as file:  # the project's own database, then the quick start's
        file.write(f"\nDATABASES = {{'default': {database!r}}}\n")
        file.write(block("django-settings"))
    save_file("accounts/emails.py", tmp_path)
    (tmp_path / "accounts" / "__init__.py").touch()

    shell(commands("django-migrate"), tmp_path, env)
    call = "from accounts.emails import sign_up; print(sign_up('ada@example.com', 'k1').outbox_id)"
    shell([f"python manage.py shell -c {shlex.quote(call)}"], tmp_path, env)
    out, _ = shell(commands("django-worker"), tmp_path, {**env, "DATABASE_URL": empty_db_dsn})
    assert "leasebox log provider: accepted" in out
    assert "kind=verification" in out


@pytest.mark.slow
def test_the_users_own_test_runs_with_leasebox_testing(tmp_path: Path) -> None:
    save_file("test_signup.py", tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_signup.py"],
        cwd=tmp_path,
        env=base_environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
