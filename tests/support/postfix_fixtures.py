"""The session's Postfix as a fixture, for every test directory that sends to it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from support.postfix import Postfix, PostfixUnavailable, running_postfix


@pytest.fixture(scope="session")
def postfix_server() -> Iterator[Postfix]:
    """Debian's Postfix, private to this test process (support.postfix); a failure under CI
    when it cannot run, a skip elsewhere."""
    stack = contextlib.ExitStack()
    try:
        running = stack.enter_context(running_postfix())
    except PostfixUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Postfix required under CI: {exc}")
        pytest.skip(f"no Postfix: {exc}")
    with stack:
        yield running
