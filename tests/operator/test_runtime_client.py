"""The operator's runtime holds one Kubernetes client, made with it.

Every pool's handlers and the start-up's peering go through `Runtime.kube`, so a discovery
answer (is the Prometheus Operator's PodMonitor served?) is asked once for all of them.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from leasebox_operator.connection import KubeConnection
from leasebox_operator.database import ConnectionPools
from leasebox_operator.handlers import Runtime
from leasebox_operator.kube import Kube
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.settings import OperatorSettings


class FakeDiscovery:
    """`CustomObjectsApi.get_api_resources`, counting the questions."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def get_api_resources(self, group: str, version: str) -> Any:
        self.asked.append((group, version))
        return SimpleNamespace(resources=[SimpleNamespace(name="podmonitors")])


def _runtime() -> Runtime:
    settings = OperatorSettings()
    return Runtime(settings, OperatorMetrics(), ConnectionPools(settings), KubeConnection())


def test_the_runtime_makes_its_client_once() -> None:
    runtime = _runtime()
    assert isinstance(runtime.kube, Kube)
    assert runtime.kube is runtime.kube
    assert runtime.kube.instance == runtime.settings.identity


async def test_every_user_of_the_runtime_shares_one_discovery_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    discovery = FakeDiscovery()
    monkeypatch.setattr(Kube, "custom", property(lambda _: discovery))
    runtime = _runtime()
    for _ in range(3):
        assert await runtime.kube.serves("monitoring.coreos.com/v1", "podmonitors")
    assert discovery.asked == [("monitoring.coreos.com", "v1")]
    other = _runtime()
    assert await other.kube.serves("monitoring.coreos.com/v1", "podmonitors")
    assert len(discovery.asked) == 2  # another runtime, another client and its own answers
