"""Ports for the servers tests start come from below the kernel's ephemeral range."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from leasebox.testing import ports


@pytest.fixture
def ephemeral_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Set the kernel's ephemeral range as `free_port` reads it (`"low high"`)."""

    def set_range(text: str) -> None:
        (tmp_path / "range").write_text(f"{text}\n")
        monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")

    return set_range


def listen_on(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_a_port_is_drawn_below_the_ephemeral_range_and_can_be_listened_on(
    ephemeral_range: Callable[[str], None],
) -> None:
    ephemeral_range("40000 60999")

    drawn = {ports.free_port() for _ in range(20)}

    assert all(20768 <= port < 32768 for port in drawn)
    assert len(drawn) > 1  # drawn at random, not one port for every caller
    for port in drawn:
        listen_on(port)


def test_with_no_room_below_the_ephemeral_range_the_kernel_chooses(
    ephemeral_range: Callable[[str], None],
) -> None:
    low, high = (int(n) for n in ports.EPHEMERAL_RANGE.read_text().split())
    ephemeral_range("1024 65535")

    port = ports.free_port()

    assert low <= port <= high  # the kernel's own choice, from its real range
    listen_on(port)


def test_a_port_something_listens_on_is_never_handed_out(
    ephemeral_range: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    ephemeral_range("32768 60999")
    low = 32768 - 12000
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        taken.listen()
        busy = int(taken.getsockname()[1])
        other = ports.free_port()
        draws = iter([busy - low, busy - low, other - low])
        monkeypatch.setattr(secrets, "randbelow", lambda _: next(draws))

        assert ports.free_port() == other
