"""The benchmark seeds OTP rows without payload keys: it opts in to plaintext secrets. Its
tests share the test suite's server, as a benchmark run shares one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bench.pgserver import BenchServer

from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")


@pytest.fixture
def bench_server(server_dsn: str) -> Iterator[BenchServer]:
    server = BenchServer(server_dsn)
    try:
        yield server
    finally:
        server.drop_all()
