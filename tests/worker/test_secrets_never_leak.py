"""No OTP code, secret, password or recipient reaches a worker's logs, metrics or stored errors.

A real worker process sends real OTPs over SMTP (with credentials) from an outbox whose
secrets are encrypted, through every path that logs: success, a transient failure and its
retry, a permanent rejection whose reply quotes the address, debug level on. Everything it
printed and every metric it exported is then searched for each sensitive value.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from psycopg import conninfo
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from leasebox.delivery.rendering import TemplateRenderer
from leasebox.producer.payload_crypto import PayloadCipher, generate_key
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.worker import Worker
from leasebox.testing.ports import free_port
from support.outbox_rows import insert_message
from support.waiting import wait_for
from support.worker_doubles import Insert, ScriptedProvider, row_of, statuses

SMTP_PASSWORD = "smtp-pw-" + secrets.token_hex(6)
DSN_PASSWORD = "dsn-pw-" + secrets.token_hex(6)
SECRET_NAME = "Zebulon-" + secrets.token_hex(4)
REJECTED = "gone@example.com"
FLAKY = "flaky@example.com"


class Handler:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.flaky_left = 1

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if address == REJECTED:
            return f"550 5.1.1 <{address}>: no such user"
        if address == FLAKY and self.flaky_left:
            self.flaky_left -= 1
            return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.bodies.append(envelope.content)
        return "250 OK"


def authenticate(
    server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and auth_data.password == SMTP_PASSWORD.encode()
    return AuthResult(success=ok, handled=False)


@pytest.fixture
def smtp() -> Iterator[tuple[int, Handler]]:
    handler = Handler()
    port = free_port()
    controller = Controller(
        handler, hostname="127.0.0.1", port=port, authenticator=authenticate, auth_require_tls=False
    )
    controller.start()
    yield port, handler
    controller.stop()


def _with_password(dsn: str) -> str:
    params = conninfo.conninfo_to_dict(dsn)
    params["password"] = DSN_PASSWORD  # ignored by trust authentication, present everywhere
    return conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def test_no_code_secret_password_or_recipient_reaches_logs_metrics_or_stored_errors(
    db_dsn: str, db_conn: psycopg.Connection, smtp: tuple[int, Handler]
) -> None:
    port, handler = smtp
    key = generate_key()
    cipher = PayloadCipher([key])
    codes = [f"C{secrets.token_hex(5)}" for _ in range(12)]
    recipients = [REJECTED, FLAKY, *(f"user{i}@example.com" for i in range(10))]
    for i, (code, recipient) in enumerate(zip(codes, recipients, strict=True)):
        insert_message(
            db_conn,
            kind="otp",
            aggregate_id=f"user-{i}",
            recipient=recipient,
            template="otp",
            data=Jsonb({"name": SECRET_NAME, "minutes_valid": 5}),
            secrets=cipher.seal({"code": code}),
            delivery_key=f"otp:leak-test-{i}",
        )
    db_conn.commit()
    metrics_port = free_port()
    env = {
        **os.environ,
        "LEASEBOX_DSN": _with_password(db_dsn),
        "LEASEBOX_PROVIDER_URL": f"smtp://mailer:{SMTP_PASSWORD}@127.0.0.1:{port}?starttls=false",
        "LEASEBOX_PAYLOAD_KEYS": key,
        "LEASEBOX_LOG_LEVEL": "debug",
        "LEASEBOX_LOG_FORMAT": "json",
        "LEASEBOX_METRICS_PORT": str(metrics_port),
        "LEASEBOX_METRICS_HOST": "127.0.0.1",
        "LEASEBOX_BACKOFF_BASE": "0.05",
        "LEASEBOX_BACKOFF_MAX": "0.05",
        "LEASEBOX_POLL_INTERVAL": "0.05",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "leasebox", "worker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    scraped = []
    try:
        wait_for(
            lambda: process.poll() is not None or statuses(db_conn) == {"sent": 11, "dead": 1},
            what="every message sent or dead",
            timeout=60,
        )
        assert process.poll() is None, process.communicate()[1]
        for path in ("metrics", "readyz", "healthz"):
            url = f"http://127.0.0.1:{metrics_port}/{path}"
            with urllib.request.urlopen(url, timeout=5) as response:
                scraped.append(response.read().decode())
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    # The run did take every logging path, and the codes really went out.
    assert 'leasebox_retries_total{error_class="smtp_451",kind="otp"} 1.0' in scraped[0]
    assert 'leasebox_dead_letters_total{kind="otp",reason="rejected"} 1.0' in scraped[0]
    assert '"message":"sent"' in err
    delivered = b"".join(handler.bodies)
    assert all(code.encode() in delivered for code in codes[1:])
    assert SECRET_NAME.encode() in delivered
    everything = "\n".join([out, err, *scraped])
    # Recipients too: the worker logs none, and the SMTP server's 550 quotes the refused
    # address, which the provider masks before the reply becomes a log line or `last_error`.
    sensitive = [*codes, SMTP_PASSWORD, DSN_PASSWORD, key, SECRET_NAME, *recipients]
    leaked = [value for value in sensitive if value.lower() in everything.lower()]
    assert leaked == []
    stored_errors = db_conn.execute(
        "SELECT string_agg(coalesce(last_error, ''), ' ') FROM leasebox.messages"
    ).fetchone()
    assert stored_errors is not None
    assert not [value for value in sensitive if value in (stored_errors[0] or "")]


async def test_a_template_that_transforms_the_code_leaks_it_nowhere(
    db_pool: AsyncConnectionPool,
    fake_provider: ScriptedProvider,
    db_insert: Insert,
    db_conn: psycopg.Connection,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    code = "8675309"
    (tmp_path / "leaky").mkdir()
    (tmp_path / "leaky" / "subject.txt.j2").write_text("Code {{ lookup[code | reverse] }}")
    (tmp_path / "leaky" / "body.txt.j2").write_text("{{ code }}")
    outbox_id = db_insert(template="leaky", code=code, data=json.dumps({"lookup": {}}))
    worker = Worker(
        WorkerSettings(kinds=("otp",), listen=False, drain=True, poll_interval=0.02),
        db_pool,
        fake_provider,
        TemplateRenderer(tmp_path),
    )
    with caplog.at_level(logging.DEBUG, logger="leasebox"):
        async with asyncio.timeout(20):
            await worker.run()
    row = row_of(db_conn, outbox_id)
    assert (row["status"], row["dead_reason"]) == ("dead", "invalid_message")
    assert row["last_error"] == "template leaky/subject.txt.j2 failed: UndefinedError"
    assert fake_provider.sent == []
    logged = "\n".join(record.getMessage() + repr(record.__dict__) for record in caplog.records)
    assert "invalid_message" in logged
    for value in (code, code[::-1]):
        assert value not in logged
        assert value not in str(row["last_error"])
