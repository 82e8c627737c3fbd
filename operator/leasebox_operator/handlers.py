"""The kopf handlers: thin glue between kopf's events and the operator's logic.

`kopf run -m leasebox_operator.handlers` (or `leasebox operator`) loads this module. Each
handler parses the pool, delegates (children to `reconcile`, backlog and scaling to
`polling`) and reports through the pool's single `StatusWriter` and one Event per fact.
A spec the models reject is reported as `Ready=False` with the reason and left alone
until it changes: a bad spec never becomes a retry loop or a crashing daemon. The poll
loop applies the children again every resync period, so a Deployment edited by hand is
put back even when its pool does not change.

What a poll costs is kept small because one operator serves hundreds of pools: the
worker Deployments are read from one watch (`WorkerDeployments`) rather than one GET per
poll, a status is written only when something material changed (see
`status`), and each pool's first poll waits a random part of its interval (its first
resync a random part of the resync period), so pools started together (an operator's
start, a bulk apply) spread their polls over the interval.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.aio.client import ApiException

from leasebox_operator import reconcile
from leasebox_operator.children import MANAGED_BY, Pool, selector
from leasebox_operator.connection import KubeConnection
from leasebox_operator.database import ConnectionPools, DatabaseBacklogSource
from leasebox_operator.errors import PoolProblem
from leasebox_operator.kube import Kube
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.models import GROUP, PLURAL, VERSION, PoolStatus
from leasebox_operator.polling import PoolPoller, backoff_delay
from leasebox_operator.pool_kube import (
    CachedDeployment,
    DeploymentCache,
    PoolKubeAdapter,
    cached_deployment,
)
from leasebox_operator.settings import OperatorSettings
from leasebox_operator.status import StatusWriter

RESOURCE = (GROUP, VERSION, PLURAL)
INVALID_SPEC_RECHECK_SECONDS = 5.0
PROBLEM_RECHECK_SECONDS = 30.0
logger = logging.getLogger("leasebox_operator")
WORKERS = f"app.kubernetes.io/managed-by={MANAGED_BY}"
WATCH_SECONDS = 240  # the server ends a watch after this; it resumes from its last version
WATCH_RETRY_SECONDS = 5.0
WATCH_FORBIDDEN_RETRY_SECONDS = 300.0


class WorkerDeployments:
    """The operator's worker Deployments in one scope (a namespace, None: all), kept by a
    watch with a label selector: the server sends only the operator's Deployments.

    Polls read `items`; a Deployment it lacks is read from the API (`PoolKubeAdapter`), so
    the cache is an optimisation only: while the watch is down or refused (a Role without
    `list` and `watch` on Deployments) `items` is empty and polls read as before.
    """

    def __init__(self, kube: Kube, namespace: str | None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.items: dict[tuple[str, str], CachedDeployment] = {}
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"watch deployments {self.namespace}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def _keep(self, kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if kind == "DELETED":
            self.items.pop(key, None)
        else:
            self.items[key] = cached_deployment(body)

    async def sync(self) -> None:
        """List, then follow the watch until the server ends it or the version expires."""
        listing = await self.kube.list_deployments(self.namespace, WORKERS)
        self.items.clear()
        for body in listing.get("items") or []:
            self._keep("ADDED", body)
        version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        while True:
            events = self.kube.watch_deployments(self.namespace, WORKERS, version, WATCH_SECONDS)
            async for event in events:
                kind, body = str(event.get("type")), event.get("object") or {}
                if kind == "ERROR":
                    return  # 410 Gone: the version expired, list again
                version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    self._keep(kind, body)

    async def run(self) -> None:
        while True:
            try:
                await self.sync()
                continue
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                forbidden = exc.status == 403
                wait = WATCH_FORBIDDEN_RETRY_SECONDS if forbidden else WATCH_RETRY_SECONDS
                logger.warning(
                    "watching the worker Deployments failed (HTTP %s)%s; retrying in %gs",
                    exc.status,
                    ": the role lacks list or watch on deployments, polls read them one by one"
                    if forbidden
                    else "",
                    wait,
                )
            except Exception as exc:  # a dropped connection, not logged in yet
                wait = WATCH_RETRY_SECONDS
                logger.info("watching the worker Deployments: %s; retrying in %gs", exc, wait)
            self.items.clear()
            await asyncio.sleep(wait)


@dataclass
class Runtime:
    """What every pool's handlers share for the life of the operator."""

    settings: OperatorSettings
    metrics: OperatorMetrics
    pools: ConnectionPools
    connection: KubeConnection
    # Set by the cleanup activity: a poll loop still running then ends by itself, rather
    # than retrying without a login until kopf cancels it.
    closed: bool = False
    # The wait before a pool's first poll, given its interval (a random part of it).
    stagger: Callable[[float], float] = field(default=lambda interval: random.uniform(0, interval))
    kube: Kube = field(init=False)
    """The operator's one API client, made with the runtime: it follows re-logins (see
    `Kube`), and its discovery answers are shared by every pool's handlers."""

    watches: dict[str | None, WorkerDeployments] = field(init=False, default_factory=dict)
    """The watches of the worker Deployments: one for the cluster, else one per namespace."""

    def __post_init__(self) -> None:
        self.kube = Kube(self.connection.api, instance=self.settings.identity)

    def deployments(self, namespace: str) -> DeploymentCache:
        """The worker Deployments of `namespace` as a watch delivers them (started on first
        use: the namespaces of a glob pattern are known only once their pools appear)."""
        scope = None if self.settings.clusterwide else namespace
        watch = self.watches.get(scope)
        if watch is None:
            watch = self.watches[scope] = WorkerDeployments(self.kube, scope)
            watch.start()
        return watch.items

    async def close(self) -> None:
        watches, self.watches = list(self.watches.values()), {}
        for watch in watches:
            await watch.stop()


def configure_kopf(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    """Finalizer, annotations and peering under `leasebox.dev`; kopf posts no Events."""
    prefix = ours.annotation_prefix
    settings.persistence.finalizer = ours.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # the operator posts its own, one per fact
    settings.networking.error_backoffs = ours.api_backoffs
    settings.execution.max_workers = 4
    settings.peering.lifetime = ours.peering_lifetime_seconds


def _connection(memo: kopf.Memo) -> KubeConnection:
    connection: KubeConnection = memo.setdefault("connection", KubeConnection())
    return connection


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = memo.get("settings") or OperatorSettings.from_environ()
    configure_kopf(settings, ours)
    connection = _connection(memo)
    connection.identity = ours.identity
    if "runtime" not in memo:  # kopf retries a failed startup: serve the metrics once
        metrics = OperatorMetrics()
        metrics.serve(ours.metrics_port, ours.metrics_host)
        memo["runtime"] = Runtime(ours, metrics, ConnectionPools(ours), connection)
    if not ours.standalone:
        # Peers meet in kopf's peering object; it must exist before kopf's first keep-alive.
        await connection.login(trust_env=settings.networking.trust_env)
        kube = _runtime(memo).kube
        literal = [ns for ns in ours.namespaces if not any(c in ns for c in "*?[")]
        for namespace in [None] if ours.clusterwide else literal:
            if await kube.ensure_peering(ours.peering_name, namespace):
                logger.info("created kopf peering %s in %s", ours.peering_name, namespace)


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """One login for kopf and the official client (kopf calls it again after a 401)."""
    return await _connection(memo).login(trust_env=settings.networking.trust_env)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None:
        runtime.closed = True
        await runtime.close()
        await runtime.pools.close()
        runtime.metrics.close()
    await _connection(memo).close()


def _runtime(memo: kopf.Memo) -> Runtime:
    runtime: Runtime = memo["runtime"]
    return runtime


def _writer(memo: kopf.Memo, runtime: Runtime, body: kopf.Body) -> StatusWriter:
    """The pool's one status writer, created on first use from the stored status."""
    writer: StatusWriter | None = memo.get("status_writer")
    if writer is None:
        namespace, name = body.metadata.namespace or "", body.metadata.name or ""

        async def patch_status(patch: dict[str, Any]) -> None:
            await runtime.kube.patch_pool_status(namespace, name, patch)

        writer = StatusWriter(
            patch_status,
            dict(body.get("status") or {}),
            heartbeat_seconds=runtime.settings.status_heartbeat_seconds,
        )
        memo["status_writer"] = writer
    return writer


async def _report(
    runtime: Runtime, writer: StatusWriter, body: kopf.Body, problem: PoolProblem | None
) -> None:
    """Ready's spec part, and one Event when it turns into a (new) problem."""
    generation = body.metadata.get("generation")
    before = writer.problems.get("spec")
    part = None if problem is None else (problem.reason, problem.message)
    await writer.write(
        PoolStatus(observed_generation=generation), generation=generation, problems={"spec": part}
    )
    if problem is not None and part != before:
        await runtime.kube.post_event(body, "Warning", problem.reason, problem.message)


async def _reconcile(runtime: Runtime, body: kopf.Body, pool: Pool, writer: StatusWriter) -> None:
    """Check the Secrets, apply the children, report; raises `PoolProblem`."""
    kube = runtime.kube
    await reconcile.check_secrets(kube, pool)
    settings = runtime.settings
    applied = await reconcile.apply_children(
        kube, body, pool, settings.worker_image, settings.runbook_base_url
    )
    if applied.changed:
        await kube.post_event(body, "Normal", "Reconciled", applied.summary())
    for warning in applied.warnings:
        await kube.post_event(body, "Warning", "MonitoringUnavailable", warning)
    await writer.write(PoolStatus(selector=selector(pool), kinds=", ".join(pool.spec.kinds)))


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
async def reconcile_pool(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Apply the pool's children and report the spec part of `Ready`."""
    runtime = _runtime(memo)
    writer = _writer(memo, runtime, body)
    try:
        pool = reconcile.parse_pool(body)
    except PoolProblem as exc:
        await _report(runtime, writer, body, exc)
        return
    try:
        await _reconcile(runtime, body, pool, writer)
    except PoolProblem as exc:
        await _report(runtime, writer, body, exc)
        raise kopf.TemporaryError(exc.message, delay=PROBLEM_RECHECK_SECONDS) from None
    await _report(runtime, writer, body, None)


@kopf.on.delete(*RESOURCE, optional=True)
async def forget_pool(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Children go with their owner (ownerReferences); only the metrics need dropping."""
    _runtime(memo).metrics.forget(body.metadata.namespace or "", body.metadata.name or "")


@kopf.daemon(*RESOURCE, cancellation_timeout=10.0)
async def poll_pool(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """The pool's poll loop: one backlog query per interval, scaling only on change."""
    runtime = _runtime(memo)
    namespace, name = body.metadata.namespace or "", body.metadata.name or ""
    writer = _writer(memo, runtime, body)
    cache = runtime.deployments(namespace)
    kube = PoolKubeAdapter(runtime.kube, body, namespace, f"{name}-worker", cache)
    poller = PoolPoller(
        namespace=namespace,
        name=name,
        kube=kube,
        source=DatabaseBacklogSource(runtime.kube, namespace, runtime.pools),
        status=writer,
        metrics=runtime.metrics,
        max_backoff_seconds=runtime.settings.max_poll_backoff_seconds,
    )
    # Pools started together spread their first poll over the interval and their resyncs
    # over the resync period, so that neither comes in bursts.
    resynced = time.monotonic() - runtime.stagger(runtime.settings.resync_seconds)
    await stopped.wait(runtime.stagger(_interval(body)))
    parse = reconcile.PoolParser()
    while not stopped and not runtime.closed:
        resync = time.monotonic() - resynced >= runtime.settings.resync_seconds
        delay = await _poll(poller, kube, body, runtime, writer, parse, resync=resync)
        if resync:
            resynced = time.monotonic()
        await stopped.wait(delay)


def _interval(body: kopf.Body) -> float:
    """The pool's poll interval, or the recheck delay of a spec the models reject."""
    try:
        return float(reconcile.parse_pool(body).spec.scaling.poll_interval_seconds)
    except PoolProblem:
        return INVALID_SPEC_RECHECK_SECONDS


async def _resync(runtime: Runtime, body: kopf.Body, pool: Pool, writer: StatusWriter) -> None:
    """Apply the children again; a problem is reported as the reconcile handler would."""
    try:
        await _reconcile(runtime, body, pool, writer)
    except PoolProblem as exc:
        await _report(runtime, writer, body, exc)
    else:
        await _report(runtime, writer, body, None)


async def _poll(
    poller: PoolPoller,
    kube: PoolKubeAdapter,
    body: kopf.Body,
    runtime: Runtime,
    writer: StatusWriter,
    parse: Callable[[kopf.Body], Pool],
    *,
    resync: bool,
) -> float:
    """One iteration of the loop; never raises except to cancel.

    The children are applied again every resync period, and at once when the worker
    Deployment is missing or its spec changed (the watch shows a new generation), so an
    edit of the Deployment made by hand is put back on the next poll."""
    try:
        pool = parse(body)
    except PoolProblem:
        return INVALID_SPEC_RECHECK_SECONDS  # the reconcile handler reports it
    try:
        if resync:
            await _resync(runtime, body, pool, writer)  # puts back drift made by hand
        delay = await poller.poll_once(pool.spec, body.metadata.get("generation"))
        if poller.deployment_missing or kube.changed:
            kube.changed = False
            await _resync(runtime, body, pool, writer)
    except asyncio.CancelledError:
        raise
    except kopf.TemporaryError as exc:  # not logged in yet, or logged out while stopping
        wait = float(exc.delay or 1)
        logger.info("pool %s/%s: %s; polling again in %gs", pool.namespace, pool.name, exc, wait)
        return wait
    except Exception:
        runtime.metrics.poll_failed(pool.namespace, pool.name)
        poller.failures += 1
        logger.exception("pool %s/%s: poll failed", pool.namespace, pool.name)
        return backoff_delay(
            poller.failures,
            pool.spec.scaling.poll_interval_seconds,
            runtime.settings.max_poll_backoff_seconds,
        )
    return delay
