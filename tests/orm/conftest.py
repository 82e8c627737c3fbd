"""Fixtures for the ORM integrations: a `Producer` per ORM and driver, on a fresh database.

Django is configured once per process (it cannot be configured twice) with no database of
its own; each test registers its fresh database as a new connection alias.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasebox.producer.payload_crypto import KEYS_VARIABLE, generate_key
from support.orm_producers import VARIANTS, Producer, configure_django, producer_for

configure_django()


@pytest.fixture(autouse=True)
def payload_keys(monkeypatch: pytest.MonkeyPatch) -> str:
    """Keys in the environment, as a production producer has them (secrets fail closed)."""
    key = generate_key()
    monkeypatch.setenv(KEYS_VARIABLE, key)
    return key


@pytest.fixture(params=VARIANTS)
def orm_producer(request: pytest.FixtureRequest, db_dsn: str) -> Iterator[Producer]:
    """An open unit of work through one ORM and driver, on the test's database."""
    producer = producer_for(str(request.param), db_dsn)
    try:
        yield producer
    finally:
        producer.close()
