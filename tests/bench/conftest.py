"""The benchmark seeds OTP rows without payload keys: it opts in to plaintext secrets."""

from __future__ import annotations

import pytest

from leasebox.producer.payload_crypto import PLAINTEXT_VARIABLE


@pytest.fixture(autouse=True)
def plaintext_secrets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLAINTEXT_VARIABLE, "1")
