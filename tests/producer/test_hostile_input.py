"""Hostile request keys and hostile data are refused with a clear error before any statement.

An API that passes a request header straight in as the idempotency key (as the README shows)
must not have its business transaction aborted by what a client sends: a key longer than an
index entry can hold (`ProgramLimitExceeded`), a NUL byte or a lone surrogate (raw driver
errors). `data` nested a thousand levels deep raised `RecursionError` from `OutboxMessage`
(a 2,006-line traceback from the CLI), and such a row written by hand was retried as a
transient failure instead of being dead-lettered as an invalid message.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError

from leasebox import InvalidMessage, InvalidRequest, enqueue, enqueue_async, enqueue_many
from leasebox.cli.main import main
from leasebox.delivery.rendering import TemplateRenderer
from leasebox.messages import MAX_DATA_DEPTH, MAX_KEY_LENGTH, OutboxMessage, register_lazy_json
from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE, PayloadCipher
from leasebox.runtime.worker import Worker
from support.fault_rig import SETTINGS
from support.outbox_rows import count, insert_message, otp
from support.worker_doubles import ScriptedProvider


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")  # the OTP's code is a secret


HOSTILE = {
    "too long": "k" * 3000,
    "a NUL byte": "key\x00tail",
    "a lone surrogate": "key\udcfftail",
    "a line break": "key\r\nX-Injected: 1",
    "empty": "",
}


def nested_json(depth: int) -> str:
    """JSON text of objects nested `depth` deep (too deep for `json.dumps` to write)."""
    return '{"inner":' * depth + '"bottom"' + "}" * depth


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"inner": value}
    return value


def state_of(conn: psycopg.Connection[Any], delivery_key: str) -> tuple[str, str | None, int]:
    """Status, dead reason and attempts of a message (not its data, which may not decode)."""
    row = conn.execute(
        "SELECT status, dead_reason, attempts FROM leasebox.messages WHERE delivery_key = %s",
        (delivery_key,),
    ).fetchone()
    conn.rollback()
    assert row is not None
    return str(row[0]), row[1], int(row[2])


@pytest.fixture
def business(db_conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The caller's transaction, with its business change already made."""
    db_conn.execute("CREATE TABLE challenges (id serial PRIMARY KEY)")
    db_conn.commit()
    db_conn.execute("INSERT INTO challenges DEFAULT VALUES")
    return db_conn


@pytest.mark.parametrize("key", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize("argument", ["idempotency_key", "scope", "request_hash"])
def test_a_hostile_key_is_refused_before_any_statement_and_the_transaction_goes_on(
    business: psycopg.Connection[Any], argument: str, key: str
) -> None:
    if argument == "scope" and key == "":
        pytest.skip("an empty scope is the default scope")
    options: dict[str, Any] = {"idempotency_key": "request-1", argument: key}
    with pytest.raises(InvalidRequest) as caught:
        enqueue(business, otp(), **options)
    assert isinstance(caught.value, ValueError)
    text = str(caught.value)
    assert argument.replace("_", " ") in text
    assert "\n" not in text
    assert key[:10] not in text or not key  # never quoted back
    # Nothing reached the database: the caller's transaction is intact and commits.
    business.commit()
    assert business.execute("SELECT count(*) FROM challenges").fetchone() == (1,)
    assert count(business, "outbox") == 0


def test_a_key_at_the_limit_is_accepted(business: psycopg.Connection[Any]) -> None:
    key = "k" * MAX_KEY_LENGTH
    receipt = enqueue(business, otp(), idempotency_key=key, scope="s" * MAX_KEY_LENGTH)
    business.commit()
    assert receipt.idempotency_key == key


def test_a_batch_with_a_hostile_key_is_refused_whole(business: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidRequest, match="idempotency key #1"):
        enqueue_many(business, [otp(), otp()], idempotency_keys=["ok", "k" * 3000])
    business.commit()
    assert count(business, "outbox") == 0


async def test_the_async_enqueue_refuses_a_hostile_key_too(db_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        with pytest.raises(InvalidRequest):
            await enqueue_async(conn, otp(), idempotency_key="k\x00")
        await conn.execute("SELECT 1")  # the transaction is still usable


@pytest.mark.parametrize("flag", ["--idempotency-key", "--scope"], ids=["idempotency key", "scope"])
def test_the_enqueue_command_refuses_a_hostile_key_in_one_line(
    db_dsn: str, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    args = ["enqueue", "--dsn", db_dsn, "--kind", "otp", "--recipient", "ada@example.com"]
    code = main([*args, "--idempotency-key", "request-1", flag, "k\udcff" + "k" * 3000])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_the_trace_command_refuses_a_key_it_cannot_look_up_in_one_line(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Bytes that are not UTF-8 on the command line reach Python as lone surrogates.
    with pytest.raises(SystemExit) as exited:
        main(["trace", "--dsn", db_dsn, "--idempotency-key", "key\udcff"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "idempotency key" in err
    assert "Traceback" not in err


def test_data_nested_deeper_than_the_limit_is_refused_with_the_field_named() -> None:
    OutboxMessage(kind="otp", recipient="ada@example.com", data=nested(MAX_DATA_DEPTH - 1))
    for depth in (MAX_DATA_DEPTH + 1, 5000):
        with pytest.raises(InvalidMessage) as caught:
            OutboxMessage(kind="otp", recipient="ada@example.com", data=nested(depth))
        assert caught.value.field == "data"
        assert isinstance(caught.value.__cause__, ValidationError)
        [error] = caught.value.__cause__.errors()
        assert error["loc"] == ("data",)
        assert "nested" in error["msg"]


def test_the_enqueue_command_refuses_deep_data_in_one_line(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = nested_json(5000)
    args = ["enqueue", "--dsn", db_dsn, "--kind", "otp", "--recipient", "ada@example.com"]
    code = main([*args, "--data", data])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "--data" in err or "data" in err


async def test_a_deep_row_written_by_hand_is_dead_lettered_as_invalid_not_retried(
    db_dsn: str, db_conn: psycopg.Connection[Any]
) -> None:
    deep = nested_json(3000)
    insert_message(
        db_conn,
        kind="otp",
        recipient="ada@example.com",
        template="otp",
        data=deep,
        delivery_key="otp:deep",
        max_attempts=8,
    )
    db_conn.commit()
    provider = ScriptedProvider()

    async def as_the_worker_process_does(conn: psycopg.AsyncConnection[Any]) -> None:
        register_lazy_json(conn)  # `data` is decoded when a template reads it

    async with AsyncConnectionPool(
        db_dsn,
        min_size=1,
        max_size=4,
        kwargs={"autocommit": True},
        configure=as_the_worker_process_does,
    ) as pool:
        worker = Worker(
            SETTINGS, pool, provider, TemplateRenderer(), cipher=PayloadCipher(allow_plaintext=True)
        )
        task = asyncio.get_running_loop().create_task(worker.run())
        try:
            async with asyncio.timeout(30):
                while state_of(db_conn, "otp:deep")[0] not in ("dead", "sent"):
                    assert not task.done()
                    await asyncio.sleep(0.02)
        finally:
            worker.request_stop()
            async with asyncio.timeout(30):
                await task
    assert state_of(db_conn, "otp:deep") == ("dead", "invalid_message", 1)
    assert provider.sent == []
