"""Fixtures for the provider tests: real SMTP servers on loopback (see support.mail_servers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.mail_servers import (
    RecordingHandler,
    SmtpServer,
    authenticator,
    self_signed_context,
    serve,
)


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    """A plain SMTP server that accepts AUTH without TLS (credentials optional)."""
    yield from serve(RecordingHandler(), authenticator=authenticator, auth_require_tls=False)


@pytest.fixture
def smtp_starttls_server(tmp_path: Path) -> Iterator[SmtpServer]:
    """An SMTP server that insists on STARTTLS, with a self-signed certificate."""
    yield from serve(
        RecordingHandler(), tls_context=self_signed_context(tmp_path), require_starttls=True
    )
