"""What keeps a poll cheap at hundreds of pools: few status writes, a cached Deployment, a stagger.

An idle pool's status changes only in its ages, rates and messages: the writer holds those
back until its heartbeat, and writes conditions, replicas and counts at once. The poll reads
the worker Deployment from the operator's own watch of its Deployments, falling back to a read when
the watch has not delivered it, and reports the replicas it asked for until the watch shows
them. Each pool's first poll waits a part of its interval, so pools started together do not
poll together.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
from kubernetes.aio.client import ApiException

from leasebox_operator import alerts
from leasebox_operator.conditions import SLA_MET, ConditionUpdate
from leasebox_operator.connection import KubeConnection
from leasebox_operator.database import ConnectionPools
from leasebox_operator.handlers import WORKERS, Runtime, WorkerDeployments, poll_pool
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.models import BacklogStatus, PoolStatus, RatesStatus
from leasebox_operator.polling import DeploymentState
from leasebox_operator.pool_kube import CachedDeployment, PoolKubeAdapter, cached_deployment
from leasebox_operator.settings import OperatorSettings
from leasebox_operator.status import StatusWriter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _writer(clock: Clock) -> tuple[StatusWriter, list[dict[str, Any]]]:
    patches: list[dict[str, Any]] = []

    async def patch(status: dict[str, Any]) -> None:
        patches.append(status)

    writer = StatusWriter(patch, clock=clock, heartbeat_seconds=30)
    writer.problems.update(spec=None, database=None, schema=None, workers=None)
    return writer, patches


def _report(pending: int, age: int, *, replicas: int = 1, arrival: float = 0.0) -> PoolStatus:
    backlog = BacklogStatus(
        pending=pending, ready=pending, processing=0, dead=0, expired_leases=0,
        oldest_pending_age_seconds=age, oldest_ready_age_seconds=age,
    )  # fmt: skip
    rates = RatesStatus(arrival_per_second=arrival, sent_per_second=0.0)
    return PoolStatus(backlog=backlog, rates=rates, replicas=replicas)


def _sla(age: int, met: bool = True) -> ConditionUpdate:
    reason = "WithinSLA" if met else "SLAExceeded"
    return ConditionUpdate.of(SLA_MET, met, reason, f"oldest pending message is {age}s old")


async def test_an_idle_pool_writes_its_growing_ages_only_once_per_heartbeat() -> None:
    clock = Clock()
    writer, patches = _writer(clock)
    await writer.write(_report(300, 10), [_sla(10)])
    for age in range(15, 40, 5):  # five polls, 5 s apart: ages, rates and a message move
        clock.now += 5
        await writer.write(_report(300, age, arrival=age / 100), [_sla(age)])
    assert len(patches) == 1
    clock.now += 5  # the heartbeat is due: the drift is written, all of it
    await writer.write(_report(300, 45), [_sla(45)])
    assert len(patches) == 2
    assert patches[-1]["backlog"]["oldestPendingAgeSeconds"] == 45
    assert next(c for c in patches[-1]["conditions"] if c["type"] == SLA_MET)["message"] == (
        "oldest pending message is 45s old"
    )


async def test_an_unchanged_status_is_never_written_even_when_the_heartbeat_is_due() -> None:
    clock = Clock()
    writer, patches = _writer(clock)
    await writer.write(_report(300, 10), [_sla(10)])
    clock.now += 3600
    await writer.write(_report(300, 10), [_sla(10)])
    assert len(patches) == 1


async def test_counts_replicas_and_condition_flips_are_written_at_once() -> None:
    clock = Clock()
    writer, patches = _writer(clock)
    await writer.write(_report(300, 10), [_sla(10)])
    clock.now += 1
    await writer.write(_report(301, 11), [_sla(11)])
    assert patches[-1]["backlog"]["pending"] == 301
    clock.now += 1
    await writer.write(_report(301, 12, replicas=2), [_sla(12)])
    assert patches[-1]["replicas"] == 2
    clock.now += 1
    changed = await writer.write(_report(301, 70, replicas=2), [_sla(70, met=False)])
    assert changed == [(SLA_MET, "True", "False")]
    assert len(patches) == 4


async def test_a_field_reported_for_the_first_time_is_written_at_once() -> None:
    clock = Clock()
    writer, patches = _writer(clock)
    await writer.write(PoolStatus(replicas=1))
    clock.now += 1
    await writer.write(PoolStatus(replicas=1, rates=RatesStatus(arrival_per_second=0.5)))
    assert patches[-1]["rates"]["arrivalPerSecond"] == 0.5


class FakeKube:
    """`Kube.read` and `Kube.scale` of the Deployment, counting the reads."""

    def __init__(self, body: dict[str, Any] | None) -> None:
        self.body = body
        self.reads = 0
        self.scaled: list[int] = []

    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.body

    async def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        self.scaled.append(replicas)


def _deployment(replicas: int, ready: int, generation: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "otp-worker", "namespace": "mail", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": ready, "availableReplicas": ready},
    }


def _adapter(kube: FakeKube, cache: dict[tuple[str, str], CachedDeployment]) -> Any:
    return PoolKubeAdapter(kube, {}, "mail", "otp-worker", cache)  # type: ignore[arg-type]


async def test_the_poll_reads_the_deployment_from_the_watch_without_a_request() -> None:
    kube = FakeKube(_deployment(9, 9, 9))
    cache = {("mail", "otp-worker"): cached_deployment(_deployment(2, 1, 4))}
    state = await _adapter(kube, cache).read_deployment()
    assert state == DeploymentState(replicas=2, ready_replicas=1, available_replicas=1)
    assert kube.reads == 0


async def test_a_deployment_the_watch_has_not_delivered_is_read_from_the_api() -> None:
    kube = FakeKube(_deployment(3, 3, 1))
    adapter = _adapter(kube, {})
    assert await adapter.read_deployment() == DeploymentState(3, 3, 3)
    assert kube.reads == 1
    kube.body = None
    assert await adapter.read_deployment() is None


async def test_a_scale_is_reported_until_the_watch_delivers_the_newer_generation() -> None:
    kube = FakeKube(None)
    cache = {("mail", "otp-worker"): cached_deployment(_deployment(1, 1, 4))}
    adapter = _adapter(kube, cache)
    await adapter.read_deployment()
    await adapter.scale(5)
    assert kube.scaled == [5]
    assert (await adapter.read_deployment()).replicas == 5  # the watch is behind
    cache[("mail", "otp-worker")] = cached_deployment(_deployment(4, 2, 5))
    assert (await adapter.read_deployment()).replicas == 4  # someone scaled again since
    assert kube.reads == 0


async def test_a_new_generation_of_the_deployment_asks_for_its_children_again() -> None:
    cache = {("mail", "otp-worker"): cached_deployment(_deployment(1, 1, 4))}
    adapter = _adapter(FakeKube(None), cache)
    await adapter.read_deployment()
    await adapter.read_deployment()
    assert not adapter.changed
    cache[("mail", "otp-worker")] = cached_deployment(_deployment(1, 1, 5))  # a hand edit
    await adapter.read_deployment()
    assert adapter.changed


async def test_the_operators_own_scale_is_not_a_change_to_put_back() -> None:
    cache = {("mail", "otp-worker"): cached_deployment(_deployment(1, 1, 4))}
    adapter = _adapter(FakeKube(None), cache)
    await adapter.read_deployment()
    await adapter.scale(3)
    cache[("mail", "otp-worker")] = cached_deployment(_deployment(3, 1, 5))
    assert (await adapter.read_deployment()).replicas == 3
    await adapter.read_deployment()
    assert not adapter.changed


class FakeWatchApi:
    """`Kube.list_deployments` and `Kube.watch_deployments`: one list, then scripted watches."""

    def __init__(self, listing: list[dict[str, Any]], watches: list[list[dict[str, Any]]]):
        self.listing = listing
        self.watches = watches
        self.calls: list[tuple[str, str | None, str]] = []
        self.done = asyncio.Event()
        self.refused: ApiException | None = None

    async def list_deployments(self, namespace: str | None, selector: str) -> dict[str, Any]:
        self.calls.append(("list", namespace, selector))
        if self.refused is not None:
            self.done.set()
            raise self.refused
        return {"items": self.listing, "metadata": {"resourceVersion": "10"}}

    async def watch_deployments(
        self, namespace: str | None, selector: str, version: str, seconds: int
    ) -> AsyncIterator[dict[str, Any]]:
        self.calls.append(("watch", namespace, version))
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()  # the watch stays open, with nothing new
        for event in self.watches.pop(0):
            yield event


def _event(kind: str, replicas: int, name: str = "otp-worker", version: int = 11) -> Any:
    body = _deployment(replicas, replicas, 1)
    body["metadata"].update(name=name, resourceVersion=str(version))
    return {"type": kind, "object": body}


async def _watched(api: FakeWatchApi, namespace: str | None) -> WorkerDeployments:
    watch = WorkerDeployments(api, namespace)  # type: ignore[arg-type]
    watch.start()
    await asyncio.wait_for(api.done.wait(), timeout=10)
    return watch


async def test_the_watch_keeps_the_operators_deployments_by_namespace_and_name() -> None:
    first = _event("ADDED", 1, "a-worker")["object"]
    api = FakeWatchApi(
        [first],
        [
            [_event("ADDED", 2), _event("MODIFIED", 3, version=12), {"type": "BOOKMARK",
             "object": {"metadata": {"resourceVersion": "13"}}}],
            [_event("DELETED", 1, "a-worker", version=14)],
        ],
    )  # fmt: skip
    watch = await _watched(api, "mail")
    try:
        assert watch.items == {("mail", "otp-worker"): cached_deployment(_event("X", 3)["object"])}
        assert api.calls == [
            ("list", "mail", WORKERS),
            ("watch", "mail", "10"),
            ("watch", "mail", "13"),  # resumed after the server ended it, from the bookmark
            ("watch", "mail", "14"),
        ]
    finally:
        await watch.stop()


async def test_an_expired_watch_lists_again() -> None:
    api = FakeWatchApi([], [[{"type": "ERROR", "object": {"code": 410}}]])
    watch = await _watched(api, None)
    try:
        assert [call[0] for call in api.calls] == ["list", "watch", "list", "watch"]
    finally:
        await watch.stop()


async def test_a_refused_watch_leaves_the_cache_empty_so_polls_read_the_api() -> None:
    api = FakeWatchApi([_event("ADDED", 1)["object"]], [])
    api.refused = ApiException(status=403, reason="Forbidden")
    watch = await _watched(api, None)
    try:
        assert watch.items == {}
        kube = FakeKube(_deployment(2, 2, 1))
        assert (await _adapter(kube, watch.items).read_deployment()).replicas == 2
        assert kube.reads == 1
    finally:
        await watch.stop()


class Stopped:
    """kopf's `DaemonStopped`, stopping after the first wait and recording it."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __bool__(self) -> bool:
        return bool(self.waits)

    async def wait(self, delay: float) -> None:
        self.waits.append(delay)


def _body(interval: int) -> kopf.Body:
    spec = {
        "kinds": ["otp"],
        "database": {"secretRef": {"name": "db"}},
        "provider": {"secretRef": {"name": "mail"}},
        "scaling": {"pollIntervalSeconds": interval},
    }
    return kopf.Body({"metadata": {"name": "otp", "namespace": "mail"}, "spec": spec})


async def test_a_pools_first_poll_and_first_resync_are_staggered() -> None:
    settings = OperatorSettings()
    runtime = Runtime(settings, OperatorMetrics(), ConnectionPools(settings), KubeConnection())
    asked: list[float] = []

    def stagger(interval: float) -> float:
        asked.append(interval)
        return interval / 4

    runtime.stagger = stagger
    stopped = Stopped()
    daemon: Any = poll_pool  # the function kopf calls, with the arguments it passes
    await daemon(stopped=stopped, body=_body(8), memo=kopf.Memo(runtime=runtime))
    assert (asked, stopped.waits) == ([300.0, 8.0], [2.0])  # the resync period, the interval


def test_the_default_stagger_spreads_first_polls_over_the_interval() -> None:
    settings = OperatorSettings()
    runtime = Runtime(settings, OperatorMetrics(), ConnectionPools(settings), KubeConnection())
    waits = [runtime.stagger(5.0) for _ in range(200)]
    assert all(0 <= wait <= 5.0 for wait in waits)
    assert min(waits) < 1.0 < 4.0 < max(waits)


def test_every_pools_alert_rules_come_from_one_parse_each_a_copy_of_its_own() -> None:
    alerts._parsed_groups.cache_clear()
    first = alerts.pool_groups("mail", "otp")
    first[0]["rules"][0]["labels"]["severity"] = "changed"
    second = alerts.pool_groups("mail", "sms")
    assert second[0]["rules"][0]["labels"]["severity"] != "changed"
    assert alerts._parsed_groups.cache_info().misses == 1
