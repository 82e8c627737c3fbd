"""The kopf handlers: thin glue between kopf's events and the operator's logic.

`kopf run -m leasebox_operator.handlers` (or `leasebox operator`) loads this module. Each
handler parses the pool, delegates (children to `reconcile`, backlog and scaling to
`polling`) and reports through the pool's single `StatusWriter`. A spec the models reject
is reported as `Ready=False` with the reason and left alone until it changes: a bad
spec never becomes a retry loop or a crashing daemon.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from leasebox_operator import reconcile
from leasebox_operator.children import Pool
from leasebox_operator.conditions import READY, ConditionUpdate
from leasebox_operator.database import ConnectionPools, DatabaseBacklogSource
from leasebox_operator.kube import Kube, PoolKubeAdapter, SecretError, resource_path
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.models import API_VERSION, GROUP, PLURAL, VERSION
from leasebox_operator.polling import PoolPoller, backoff_delay
from leasebox_operator.settings import OperatorSettings
from leasebox_operator.status import StatusWriter

RESOURCE = (GROUP, VERSION, PLURAL)
INVALID_SPEC_RECHECK_SECONDS = 5.0
SECRET_RECHECK_SECONDS = 30.0
logger = logging.getLogger("leasebox_operator")


@dataclass
class Runtime:
    """What every pool's handlers share for the life of the operator."""

    settings: OperatorSettings
    kopf_settings: kopf.OperatorSettings
    metrics: OperatorMetrics
    pools: ConnectionPools

    def kube(self) -> Kube:
        return Kube(self.kopf_settings, logger)


def configure_kopf(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    """Finalizer, annotations and Event posting under `leasebox.dev`, set in one place."""
    prefix = ours.annotation_prefix
    settings.persistence.finalizer = ours.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "leasebox-operator"
    settings.networking.error_backoffs = ours.api_backoffs
    settings.execution.max_workers = 4


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = memo.get("settings") or OperatorSettings.from_environ()
    configure_kopf(settings, ours)
    metrics = OperatorMetrics()
    metrics.serve(ours.metrics_port, ours.metrics_host)
    memo["runtime"] = Runtime(ours, settings, metrics, ConnectionPools(ours))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None:
        await runtime.pools.close()
        runtime.metrics.close()


def _runtime(memo: kopf.Memo) -> Runtime:
    runtime: Runtime = memo["runtime"]
    return runtime


def _writer(memo: kopf.Memo, runtime: Runtime, body: kopf.Body) -> StatusWriter:
    """The pool's one status writer, created on first use from the stored status."""
    writer: StatusWriter | None = memo.get("status_writer")
    if writer is None:
        kube = runtime.kube()
        path = resource_path(
            API_VERSION, PLURAL, body.metadata.namespace, body.metadata.name, "status"
        )

        async def patch_status(patch: dict[str, Any]) -> None:
            await kube.merge_patch(path, {"status": patch})

        writer = StatusWriter(patch_status, dict(body.get("status") or {}))
        memo["status_writer"] = writer
    return writer


async def _report_invalid(
    writer: StatusWriter, body: kopf.Body, message: str, generation: int | None
) -> None:
    await writer.write(
        {"observedGeneration": generation},
        [ConditionUpdate.of(READY, False, "InvalidSpec", message)],
        generation=generation,
    )
    kopf.event(body, type="Warning", reason="InvalidSpec", message=message)


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
async def reconcile_pool(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Create or patch the pool's children and report `Ready`."""
    runtime = _runtime(memo)
    writer = _writer(memo, runtime, body)
    generation = body.metadata.get("generation")
    try:
        pool = reconcile.parse_pool(body)
    except reconcile.InvalidSpec as exc:
        await _report_invalid(writer, body, exc.message, generation)
        return
    kube = runtime.kube()
    try:
        await reconcile.check_secrets(kube, pool)
    except SecretError as exc:
        await writer.write(
            {"observedGeneration": generation},
            [ConditionUpdate.of(READY, False, exc.reason, exc.message)],
            generation=generation,
        )
        kopf.event(body, type="Warning", reason=exc.reason, message=exc.message)
        raise kopf.TemporaryError(exc.message, delay=SECRET_RECHECK_SECONDS) from None
    try:
        applied = await reconcile.apply_children(kube, body, pool, runtime.settings.worker_image)
    except reconcile.ChildConflict as exc:
        await writer.write(
            {"observedGeneration": generation},
            [ConditionUpdate.of(READY, False, "ChildConflict", str(exc))],
            generation=generation,
        )
        kopf.event(body, type="Warning", reason="ChildConflict", message=str(exc))
        raise kopf.TemporaryError(str(exc), delay=SECRET_RECHECK_SECONDS) from None
    if applied.changed:
        kopf.event(body, type="Normal", reason="Reconciled", message=applied.summary())
    for warning in applied.warnings:
        kopf.event(body, type="Warning", reason="MonitoringUnavailable", message=warning)
    await writer.write(
        {"observedGeneration": generation},
        [ConditionUpdate.of(READY, True, "Reconciled", applied.ready_message())],
        generation=generation,
    )


@kopf.on.delete(*RESOURCE, optional=True)
async def forget_pool(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Children go with their owner (ownerReferences); only the metrics need dropping."""
    _runtime(memo).metrics.forget(body.metadata.namespace or "", body.metadata.name or "")


@kopf.daemon(*RESOURCE, cancellation_timeout=10.0)
async def poll_pool(
    stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """The pool's poll loop: one backlog query per interval, scaling only on change."""
    runtime = _runtime(memo)
    namespace, name = body.metadata.namespace or "", body.metadata.name or ""
    kube = runtime.kube()
    poller = PoolPoller(
        namespace=namespace,
        name=name,
        kube=PoolKubeAdapter(kube, body, namespace, f"{name}-worker"),
        source=DatabaseBacklogSource(kube, namespace, runtime.pools),
        status=_writer(memo, runtime, body),
        metrics=runtime.metrics,
        max_backoff_seconds=runtime.settings.max_poll_backoff_seconds,
    )
    while not stopped:
        delay = await _poll(poller, kube, body, runtime)
        await stopped.wait(delay)


async def _poll(poller: PoolPoller, kube: Kube, body: kopf.Body, runtime: Runtime) -> float:
    """One iteration of the loop; never raises except to cancel."""
    try:
        pool: Pool = reconcile.parse_pool(body)
    except reconcile.InvalidSpec:
        return INVALID_SPEC_RECHECK_SECONDS  # the reconcile handler reports it
    try:
        delay = await poller.poll_once(pool.spec, body.metadata.get("generation"))
        if poller.deployment_missing:
            await reconcile.apply_children(kube, body, pool, runtime.settings.worker_image)
    except asyncio.CancelledError:
        raise
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
