"""The worker's event loop: uvloop when asked for or available, asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop

from leasebox.config import event_loop_choice
from leasebox.errors import ConfigurationError
from leasebox.runtime.event_loops import loop_factory, run, running_loop_name


async def _loop_name() -> str:
    return running_loop_name()


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a platform without uvloop: importing it fails."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


def test_auto_runs_the_worker_on_uvloop_when_it_is_installed() -> None:
    assert loop_factory("auto") is uvloop.new_event_loop
    assert run(_loop_name, "auto") == "uvloop"


def test_asyncio_keeps_the_standard_loop_even_with_uvloop_installed() -> None:
    assert run(_loop_name, "asyncio") == "asyncio"


def test_uvloop_runs_on_uvloop() -> None:
    assert run(_loop_name, "uvloop") == "uvloop"


@pytest.mark.usefixtures("without_uvloop")
def test_auto_falls_back_to_asyncio_where_uvloop_is_missing() -> None:
    assert loop_factory("auto") is asyncio.new_event_loop
    assert run(_loop_name, "auto") == "asyncio"


@pytest.mark.usefixtures("without_uvloop")
def test_asking_for_a_missing_uvloop_is_a_configuration_error_before_the_worker_exists() -> None:
    started: list[str] = []

    def main() -> Coroutine[Any, Any, str]:
        started.append("main")
        return _loop_name()

    with pytest.raises(ConfigurationError, match=r"uvloop is not installed: install it"):
        run(main, "uvloop")
    assert started == []


@pytest.mark.parametrize(
    ("text", "choice"), [("auto", "auto"), (" UVLOOP ", "uvloop"), ("Asyncio", "asyncio")]
)
def test_the_choice_is_read_whatever_its_case_and_spacing(text: str, choice: str) -> None:
    assert event_loop_choice(text) == choice


@pytest.mark.parametrize("text", ["", "tokio", "uv loop"])
def test_anything_else_says_what_the_choice_must_be(text: str) -> None:
    with pytest.raises(ValueError, match=r"^auto, asyncio or uvloop$"):
        event_loop_choice(text)
