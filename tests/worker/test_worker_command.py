"""`leasebox worker` from the command line: bad input is one line and exit 2; good input runs.

Start-up failures happen before anything is claimed, so each test also checks that no row
changed state.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import psycopg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from leasebox.cli.main import main
from leasebox.cli.worker import GC_THRESHOLDS
from leasebox.producer.payload_crypto import KEYS_VARIABLE, generate_key
from leasebox.runtime import process
from leasebox.testing.ports import free_port
from support.mail_servers import RecordingHandler, SmtpServer, serve
from support.waiting import running, wait_for
from support.worker_doubles import Insert, statuses
from support.worker_options import REQUIRED, SAMPLES


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["worker", *args])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("LEASEBOX_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--provider", "mailgun"], "provider URL must start with a scheme"),
        (["--provider", "carrier-pigeon://coop"], "unknown provider scheme"),
        (["--provider", "smtp://mail:notaport"], "host or port cannot be read"),
        (["--provider", "null://", "--kinds", "otp,Invite"], "--kinds: invalid kind 'Invite'"),
        (["--provider", "null://", "--kinds", ","], "at least one message kind"),
        (["--provider", "null://", "--concurrency", "many"], "--concurrency must be a whole"),
        (["--provider", "null://", "--lease-seconds", "0"], "lease must be at least 1"),
        (["--provider", "null://", "--log-format", "xml"], "log format must be one of"),
        (["--provider", "null://", "--metrics-port", "70000"], "metrics port must be 0 to"),
        (["--provider", "null://", "--templates", "/no/such/dir"], "templates directory"),
        (["--provider", "null://", "--retention", "6h"], "--retention: the retention must be"),
        (["--provider", "null://", "--retention", "a week"], "--retention must be a duration"),
        ([], "no provider given"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run_cli(["--dsn", "postgresql://nobody@127.0.0.1:1/none", *args], capsys)
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("leasebox worker: error: ")
    assert expected in lines[0]


@pytest.mark.usefixtures("clean_env")
def test_settings_come_from_the_environment_and_name_it_when_bad(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LEASEBOX_PROVIDER_URL", "null://")
    monkeypatch.setenv("LEASEBOX_KINDS", "otp")
    monkeypatch.setenv("LEASEBOX_MAX_ATTEMPTS", "eight")
    code, lines = run_cli(["--dsn", "postgresql://nobody@127.0.0.1:1/none"], capsys)
    assert (code, len(lines)) == (2, 1)
    assert "LEASEBOX_MAX_ATTEMPTS must be a whole number" in lines[0]


@pytest.mark.usefixtures("clean_env")
def test_unusable_payload_keys_are_one_line_without_the_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LEASEBOX_PAYLOAD_KEYS", "not-a-fernet-key-Xy7")
    code, lines = run_cli(
        ["--dsn", "postgresql://nobody@127.0.0.1:1/none", "--provider", "null://"], capsys
    )
    assert (code, len(lines)) == (2, 1)
    assert "LEASEBOX_PAYLOAD_KEYS must be comma-separated Fernet keys" in lines[0]
    assert "Xy7" not in lines[0]


@pytest.mark.usefixtures("clean_env")
def test_an_unreachable_database_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dsn = f"postgresql://leasebox:pw-Zq81x@127.0.0.1:{free_port()}/app"
    code, lines = run_cli(["--dsn", dsn, "--provider", "null://"], capsys)
    assert (code, len(lines)) == (1, 1)  # a runtime failure: a restart may find it up
    assert "cannot connect to PostgreSQL at 127.0.0.1" in lines[0]
    assert "pw-Zq81x" not in lines[0]


@pytest.mark.usefixtures("clean_env")
def test_an_unmigrated_database_is_one_line(
    empty_db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run_cli(["--dsn", empty_db_dsn, "--provider", "null://"], capsys)
    assert (code, len(lines)) == (1, 1)
    assert "is not migrated" in lines[0]


@pytest.mark.usefixtures("clean_env")
def test_a_fatal_error_is_one_json_log_line_when_the_log_format_is_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--dsn", "postgresql://nobody@127.0.0.1:1/none", "--provider", "null://"]
    code, lines = run_cli([*args, "--concurrency", "many", "--log-format", "json"], capsys)
    assert (code, len(lines)) == (2, 1)
    entry = json.loads(lines[0])
    assert entry["level"] == "critical"
    assert entry["logger"] == "leasebox"
    assert entry["command"] == "worker"
    assert entry["error"] == "ConfigurationError"
    assert entry["exit_code"] == 2
    assert "--concurrency must be a whole number" in entry["message"]
    assert {"time", "level", "logger", "message"} <= set(entry)


@pytest.mark.usefixtures("clean_env")
def test_an_unreachable_smtp_host_stops_start_up_before_any_claim(
    db_dsn: str, db_insert: Insert, db_conn: psycopg.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    db_insert()
    provider = f"smtp://127.0.0.1:{free_port()}?timeout=2"
    code, lines = run_cli(["--dsn", db_dsn, "--provider", provider, "--drain"], capsys)
    assert (code, len(lines)) == (1, 1)  # the provider is down: a runtime failure
    assert "cannot start the smtp provider" in lines[0]
    assert "unreachable" in lines[0]
    assert statuses(db_conn) == {"pending": 1}


class _Authenticator:
    def __call__(
        self, server: object, session: object, envelope: object, mechanism: str, auth_data: object
    ) -> AuthResult:
        del server, session, envelope, mechanism
        ok = isinstance(auth_data, LoginPassword) and auth_data.password == b"right-pw"
        return AuthResult(success=ok, handled=False)


class _Sink:
    async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
        return "250 OK"


@pytest.fixture
def smtp_with_auth() -> Iterator[int]:
    port = free_port()
    controller = Controller(
        _Sink(),
        hostname="127.0.0.1",
        port=port,
        authenticator=_Authenticator(),
        auth_require_tls=False,
    )
    controller.start()
    yield port
    controller.stop()


@pytest.mark.usefixtures("clean_env")
def test_bad_smtp_credentials_stop_start_up_without_showing_the_password(
    db_dsn: str,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    smtp_with_auth: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db_insert()
    provider = f"smtp://mailer:wrong-pw-77@127.0.0.1:{smtp_with_auth}?starttls=false"
    code, lines = run_cli(["--dsn", db_dsn, "--provider", provider, "--drain"], capsys)
    assert (code, len(lines)) == (1, 1)
    assert "rejected the credentials" in lines[0]
    assert "wrong-pw-77" not in lines[0]
    assert statuses(db_conn) == {"pending": 1}


@pytest.mark.usefixtures("clean_env")
def test_a_busy_metrics_port_is_one_line(db_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, lines = run_cli(
            [
                "--dsn",
                db_dsn,
                "--provider",
                "null://",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(port),
            ],
            capsys,
        )
    assert (code, len(lines)) == (2, 1)
    assert f"cannot serve metrics on port {port}" in lines[0]


def _worker_process(
    db_dsn: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "leasebox", "worker", "--dsn", db_dsn, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LEASEBOX_LOG_FORMAT": "json", **(env or {})},
    )


def test_a_worker_process_drains_and_exits_0(
    db_dsn: str, db_insert: Insert, db_conn: psycopg.Connection
) -> None:
    for _ in range(20):
        db_insert()
    process = _worker_process(db_dsn, "--provider", "log://", "--drain", "--metrics-port", "0")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert statuses(db_conn) == {"sent": 20}
    assert out.count("leasebox log provider: accepted") == 20


@pytest.mark.usefixtures("clean_env")
def test_the_worker_collects_garbage_seldom_while_it_runs_and_restores_the_setting_after(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[int, int, int]] = []

    async def serve(_: process.ProcessConfig) -> int:
        seen.append(gc.get_threshold())
        return 0

    monkeypatch.setattr(process, "serve", serve)
    before = gc.get_threshold()
    code, _ = run_cli(["--dsn", "postgresql://nowhere/x", "--provider", "null://"], capsys)
    assert (code, seen) == (0, [GC_THRESHOLDS])
    assert GC_THRESHOLDS[0] > before[0]
    assert gc.get_threshold() == before


@pytest.fixture
def smtp_recorder() -> Iterator[SmtpServer]:
    yield from serve(RecordingHandler())


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_worker_process_sends_over_smtp_on_the_event_loop_it_is_told_and_says_which(
    db_dsn: str,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    smtp_recorder: SmtpServer,
    event_loop: str,
) -> None:
    for _ in range(20):
        db_insert()
    process = _worker_process(
        db_dsn,
        "--provider",
        smtp_recorder.url(),
        "--drain",
        "--metrics-port",
        "0",
        env={"LEASEBOX_EVENT_LOOP": event_loop},
    )
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert statuses(db_conn) == {"sent": 20}
    assert len(smtp_recorder.handler.delivered) == 20
    [started] = [json.loads(line) for line in err.splitlines() if "worker started" in line]
    assert started["event_loop"] == event_loop


def test_a_worker_process_serves_health_and_metrics_and_stops_on_sigterm(
    db_dsn: str, db_insert: Insert, db_conn: psycopg.Connection
) -> None:
    db_insert()
    port = free_port()
    key = generate_key()
    process = _worker_process(
        db_dsn,
        "--provider",
        "null://",
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        str(port),
        "--poll-interval",
        "0.1",
        env={KEYS_VARIABLE: key},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        metrics = _get_when_up(f"{base}/metrics", process)
        assert "leasebox_claimed_total" in metrics
        assert _get_when_up(f"{base}/healthz", process) == "ok\n"
        assert _get_when_up(f"{base}/readyz", process) == "ready\nsecrets: encrypted (1 key)\n"
        wait_for(
            lambda: running(process) and statuses(db_conn) == {"sent": 1},
            what='statuses(db_conn) == {"sent": 1}',
            timeout=30,
        )
        assert 'leasebox_sent_total{kind="otp"} 1.0' in _get_when_up(f"{base}/metrics", process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert '"message":"worker stopped"' in err
    assert '"secrets":"encrypted (1 key)"' in err
    assert key not in err


def _get_when_up(url: str, process: subprocess.Popen[str], within: float = 30) -> str:
    """GET `url` once the server answers (the worker process must stay alive meanwhile)."""

    def answer() -> str | None:
        running(process)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            return None

    return wait_for(answer, what=f"{url} to answer", timeout=within)


def test_every_setting_can_come_from_its_leasebox_variable_and_a_flag_wins() -> None:
    from leasebox.cli.main import build_parser
    from leasebox.cli.worker import process_config, read_options
    from leasebox.config import OPTIONS, Target

    # Every variable of the settings table, each with a value other than its default, as
    # the text a person (or the operator) writes.
    environ = {o.variable: o.render(SAMPLES[o.name]) for o in OPTIONS} | REQUIRED
    args = build_parser().parse_args(["worker", "--concurrency", "7"])
    config = process_config(args, environ)
    logging_values = read_options(args, environ)  # what the command configures logging with
    expected = {**SAMPLES, "concurrency": 7}
    got = {}
    for option in OPTIONS:
        holder = config.settings if option.target is Target.SETTINGS else config
        if option.name in ("log_format", "log_level"):
            got[option.variable] = logging_values[option.name]
        else:
            got[option.variable] = getattr(holder, option.name)
    assert got == {o.variable: expected[o.name] for o in OPTIONS}
    assert config.dsn == REQUIRED["LEASEBOX_DSN"]


def test_the_defaults_match_the_documented_ones() -> None:
    from leasebox.cli.main import build_parser
    from leasebox.cli.worker import process_config

    args = build_parser().parse_args(["worker"])
    config = process_config(
        args, {"LEASEBOX_DSN": "postgresql://db/app", "LEASEBOX_PROVIDER_URL": "null://"}
    )
    s = config.settings
    assert s.kinds == ("otp", "verification", "password_reset", "invite")
    assert (s.concurrency, s.batch_size, s.lease_seconds, s.poll_interval) == (32, 32, 45, 1)
    assert (s.grace_seconds, s.max_attempts, s.backoff_base, s.backoff_max) == (30, 8, 2, 300)
    assert (s.listen, s.drain, s.schema, config.metrics_port) == (True, False, "leasebox", 9108)
    assert config.metrics_host == "0.0.0.0"


@pytest.mark.usefixtures("clean_env")
def test_a_schema_older_than_the_image_is_refused_before_anything_is_claimed(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from leasebox.db.migrations import expected_schema_version

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM leasebox.schema_migrations WHERE version = %s",
                     (expected_schema_version(),))  # fmt: skip
    code, lines = run_cli(["--dsn", db_dsn, "--provider", "null://"], capsys)
    assert (code, len(lines)) == (1, 1)
    assert "is not migrated" in lines[0]
    assert f"this image needs {expected_schema_version()}" in lines[0]


def test_a_worker_started_on_a_newer_schema_says_so_in_its_log_and_on_readyz(
    db_dsn: str, db_insert: Insert, db_conn: psycopg.Connection
) -> None:
    from leasebox.db.migrations import expected_schema_version

    newer = expected_schema_version() + 1
    db_conn.execute(
        "INSERT INTO leasebox.schema_migrations (version, name) VALUES (%s, 'from_the_future')",
        (newer,),
    )
    db_conn.commit()
    db_insert()
    port = free_port()
    process = _worker_process(
        db_dsn, "--provider", "null://", "--metrics-host", "127.0.0.1", "--metrics-port", str(port)
    )
    try:
        readiness = _get_when_up(f"http://127.0.0.1:{port}/readyz", process)
        wait_for(
            lambda: running(process) and statuses(db_conn) == {"sent": 1},
            what='statuses(db_conn) == {"sent": 1}',
            timeout=30,
        )  # it works all the same
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    said = f"schema 'leasebox' is at version {newer}, newer than this worker's "
    assert f"{said}{expected_schema_version()}" in readiness
    warnings = [json.loads(line) for line in err.splitlines() if said in line]
    assert [w["level"] for w in warnings] == ["warning"]


@pytest.mark.usefixtures("clean_env")
def test_a_schema_newer_than_the_image_is_served_as_the_upgrade_guide_promises(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/upgrading.md: the schema goes first, and workers of the release before keep
    # working on it while the new ones roll out.
    from leasebox.db.migrations import expected_schema_version

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO leasebox.schema_migrations (version, name) VALUES (%s, 'next')",
                     (expected_schema_version() + 1,))  # fmt: skip
    code, _ = run_cli(
        ["--dsn", db_dsn, "--provider", "null://", "--drain", "--metrics-port", "0"], capsys
    )
    assert code == 0
