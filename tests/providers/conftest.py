"""Fixtures for the provider tests: real SMTP servers on loopback (see support.mail_servers),
and a private Postfix for the whole session (see support.postfix)."""

from __future__ import annotations

import contextlib
import os
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
from support.postfix import Postfix, PostfixUnavailable, running_postfix


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


@pytest.fixture(scope="session")
def postfix_server() -> Iterator[Postfix]:
    """Debian's Postfix, private to this test process; a failure under CI when it cannot run,
    a skip elsewhere."""
    stack = contextlib.ExitStack()
    try:
        running = stack.enter_context(running_postfix())
    except PostfixUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Postfix required under CI: {exc}")
        pytest.skip(f"no Postfix: {exc}")
    with stack:
        yield running
