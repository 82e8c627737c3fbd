"""Secrets fail closed: without keys nothing is stored in the clear unless a person allowed it,
and the worker says which mode it runs in."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from aiohttp import ClientSession
from psycopg_pool import AsyncConnectionPool

from leasebox import ConfigurationError, OutboxMessage, PayloadKeyError, enqueue
from leasebox.cli.main import main
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.producer.payload_crypto import (
    KEYS_VARIABLE,
    PLAINTEXT_VARIABLE,
    PayloadCipher,
    default_cipher,
    generate_key,
)
from leasebox.runtime.health import HealthServer, build_app
from leasebox.runtime.settings import WorkerSettings
from leasebox.runtime.worker import Worker
from support.worker_doubles import ScriptedProvider

CODE = {"code": "493817"}


@pytest.fixture
def no_key_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEYS_VARIABLE, raising=False)
    monkeypatch.delenv(PLAINTEXT_VARIABLE, raising=False)


def otp() -> OutboxMessage:
    return OutboxMessage(kind="otp", recipient="ada@example.com", secrets=CODE)


def count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM leasebox.outbox").fetchone()
    return int(row[0]) if row else -1


def test_sealing_without_keys_is_refused_with_what_to_do() -> None:
    with pytest.raises(PayloadKeyError) as caught:
        PayloadCipher().seal(CODE)
    assert isinstance(caught.value, ConfigurationError)
    assert KEYS_VARIABLE in str(caught.value)
    assert "leasebox keys generate" in str(caught.value)
    assert f"{PLAINTEXT_VARIABLE}=1" in str(caught.value)
    assert "493817" not in str(caught.value)


@pytest.mark.usefixtures("no_key_settings")
def test_an_enqueue_with_secrets_and_no_keys_writes_nothing(
    db_conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(ConfigurationError, match="refusing to store secrets unencrypted"):
        enqueue(db_conn, otp())
    db_conn.rollback()
    link = {"link": "https://example.com/v/1"}
    enqueue(db_conn, OutboxMessage(kind="verification", recipient="ada@example.com", data=link))
    db_conn.commit()
    assert count(db_conn) == 1  # a message without secrets needs no keys


def test_plaintext_is_stored_only_when_allowed_explicitly(
    db_conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEYS_VARIABLE, raising=False)
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "true")
    enqueue(db_conn, otp())
    db_conn.commit()
    row = db_conn.execute("SELECT secrets FROM leasebox.outbox").fetchone()
    assert row is not None
    assert bytes(row[0]).startswith(b"p1:")
    assert default_cipher().mode.startswith("plaintext allowed")


def test_keys_win_over_the_plaintext_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEYS_VARIABLE, generate_key())
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")
    assert default_cipher().seal(CODE).startswith(b"f1:")
    assert default_cipher().mode == "encrypted (1 key)"


def test_a_plaintext_switch_that_is_neither_yes_nor_no_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEYS_VARIABLE, raising=False)
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "perhaps")
    with pytest.raises(ConfigurationError, match=f"{PLAINTEXT_VARIABLE} must be true or false"):
        default_cipher()


@pytest.mark.usefixtures("no_key_settings")
def test_the_enqueue_command_refuses_secrets_without_keys_in_one_line(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["enqueue", "--dsn", db_dsn, "--kind", "otp", "--recipient", "ada@example.com"]
    assert main([*args, "--secret", "code=493817"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "refusing to store secrets unencrypted" in line
    assert "493817" not in line


def test_keys_generate_prints_a_fresh_usable_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "generate"]) == 0
    first = capsys.readouterr().out.strip()
    assert main(["keys", "generate"]) == 0
    second = capsys.readouterr().out.strip()
    assert first != second
    rotated = PayloadCipher([second, first])
    assert rotated.open(PayloadCipher([first]).seal(CODE)) == CODE


def test_keys_help_explains_the_rotation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["keys", "generate", "--help"])
    text = capsys.readouterr().out
    assert "add the new key at the END" in text
    assert "move it to the FRONT" in text


@pytest.mark.parametrize(
    ("cipher", "mode"),
    [
        (PayloadCipher([generate_key(), generate_key()]), "secrets: encrypted (2 keys)"),
        (PayloadCipher(allow_plaintext=True), "secrets: plaintext allowed"),
        (PayloadCipher(), "secrets: no keys (LEASEBOX_PAYLOAD_KEYS unset"),
    ],
)
async def test_readiness_says_how_secrets_are_handled(
    db_pool: AsyncConnectionPool, fake_provider: ScriptedProvider, cipher: PayloadCipher, mode: str
) -> None:
    worker = Worker(
        WorkerSettings(kinds=("otp",), listen=False),
        db_pool,
        fake_provider,
        TemplateRenderer(),
        cipher=cipher,
    )
    server = HealthServer(
        build_app(worker.metrics, worker.readiness_problem, details=worker.status_lines),
        "127.0.0.1",
    )
    await server.start()
    try:
        async with ClientSession() as session:
            url = f"http://127.0.0.1:{server.port}/readyz"
            async with session.get(url) as response:
                ready = (response.status, await response.text())
            fake_provider.problem = "down"
            async with asyncio.timeout(10), session.get(url) as response:
                not_ready = (response.status, await response.text())
    finally:
        await server.stop()
    assert ready[0] == 200
    assert ready[1].splitlines()[0] == "ready"
    assert ready[1].splitlines()[1].startswith(mode)
    assert not_ready[0] == 503
    assert not_ready[1].splitlines()[1].startswith(mode)
