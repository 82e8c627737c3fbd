"""Fixtures for the emulated API server's own tests: the server and an HTTP client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from support.kube.emulator import KubeEmulator


@pytest.fixture
async def http(kube_emulator: KubeEmulator) -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client pointed at the emulated API server."""
    async with aiohttp.ClientSession(base_url=kube_emulator.url) as session:
        yield session
