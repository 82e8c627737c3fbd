"""The objects a pool owns, built as plain manifests from its spec.

Pure functions: a spec in, a manifest out. `reconcile` adds ownership (`kopf.adopt`) and
applies them with server-side apply; tests read them without a cluster. Secrets reach the
workers by reference (`secretKeyRef`), never by value, so nothing secret passes through the
operator into a manifest. What a pool's `podTemplate` adds is merged *under* what the
operator sets: selector labels, the security context and the operator's environment stay
the operator's, so no spec can move a worker out of the restricted Pod Security profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from leasebox import config
from leasebox_operator import alerts
from leasebox_operator.models import (
    DSN_VARIABLE,
    MAX_NAME_LENGTH,
    PAYLOAD_KEYS_VARIABLE,
    PROVIDER_VARIABLE,
    TEMPLATES_DIR,
    PoolSpec,
    SecretKeyRef,
)
from leasebox_operator.pod_fields import dump

__all__ = ["MAX_NAME_LENGTH", "TEMPLATES_DIR"]

# The workers serve /metrics and the probes on the port they take by default.
WORKER_METRICS_PORT: int = config.METRICS_PORT.default
POOL_LABEL = "leasebox.dev/pool"
MANAGED_BY = "leasebox-operator"
# Workers stop claiming on SIGTERM and finish in-flight sends within a lease (their grace);
# the pod's grace period outlasts it, so a send never dies holding a lease it could finish.
GRACE_BEYOND_LEASE_SECONDS = 15
TERMINATION_MESSAGES = "FallbackToLogsOnError"
# Each kind of child: its apiVersion and its resource's plural, for the manifests below, the
# API paths (`kube`) and the check that the cluster serves it (`reconcile`).
CHILD_RESOURCES = {
    "Deployment": ("apps/v1", "deployments"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
    "PodMonitor": ("monitoring.coreos.com/v1", "podmonitors"),
    "PrometheusRule": ("monitoring.coreos.com/v1", "prometheusrules"),
}


@dataclass(frozen=True)
class Pool:
    """One OutboxWorkerPool: where it lives and its validated spec."""

    namespace: str
    name: str
    spec: PoolSpec

    @property
    def deployment_name(self) -> str:
        return f"{self.name}-worker"


def selector_labels(pool: Pool) -> dict[str, str]:
    """Labels that select the pool's worker pods (immutable once the Deployment exists)."""
    return {"app.kubernetes.io/name": "leasebox-worker", "app.kubernetes.io/instance": pool.name}


def selector(pool: Pool) -> str:
    """The worker pods' label selector as a string (the scale subresource's `selector`)."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector_labels(pool).items()))


def pod_labels(pool: Pool) -> dict[str, str]:
    return {
        **selector_labels(pool),
        "app.kubernetes.io/managed-by": MANAGED_BY,
        POOL_LABEL: pool.name,
    }


def _secret_env(name: str, ref: SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def worker_settings(pool: Pool) -> dict[str, object]:
    """The worker settings a pool's spec decides, by the worker's own names and types.

    Rendered into env by the worker's settings table, so that what the operator writes is
    exactly what `leasebox worker` reads (a test round-trips a spec through both).
    """
    spec, worker = pool.spec, pool.spec.worker
    chosen: dict[str, object] = {
        config.SCHEMA.name: spec.database.schema_name,
        config.KINDS.name: tuple(spec.kinds),
        config.CONCURRENCY.name: worker.concurrency,
        config.LEASE_SECONDS.name: float(worker.lease_seconds),
        # In-flight sends may finish within a lease after SIGTERM; the pod's grace is longer.
        config.GRACE.name: float(worker.lease_seconds),
        config.MAX_ATTEMPTS.name: worker.max_attempts,
        config.BACKOFF_BASE.name: float(worker.backoff_base_seconds),
        config.BACKOFF_MAX.name: float(worker.backoff_max_seconds),
        config.METRICS_PORT.name: WORKER_METRICS_PORT,
        config.LOG_FORMAT.name: worker.log_format,
    }
    if worker.templates_config_map:
        chosen[config.TEMPLATES.name] = PurePosixPath(TEMPLATES_DIR)
    if spec.database.retention_days is not None:
        chosen[config.RETENTION.name] = spec.database.retention_days * 86400.0
    if spec.priorities:
        sla = spec.sla.oldest_pending_age_seconds
        chosen[config.PRIORITIES.name] = tuple(
            config.KindPriority(p.kind, p.priority, float(p.sla_seconds or sla))
            for p in spec.priorities
        )
    quota = spec.provider.quota
    if quota is not None:
        chosen[config.QUOTA.name] = quota.per_second
        chosen[config.QUOTA_BURST.name] = quota.burst
        chosen[config.QUOTA_ACCOUNT.name] = quota.account
    return {name: value for name, value in chosen.items() if value is not None}


def worker_env(pool: Pool) -> list[dict[str, Any]]:
    """The worker's environment: settings by value, secrets by reference, then the pool's."""
    spec, worker = pool.spec, pool.spec.worker
    env = [
        _secret_env(DSN_VARIABLE, spec.database.secret_ref),
        _secret_env(PROVIDER_VARIABLE, spec.provider.secret_ref),
        *(
            {"name": name, "value": value}
            for name, value in config.environment(worker_settings(pool))
        ),
    ]
    if worker.payload_keys_secret_ref:
        env.append(_secret_env(PAYLOAD_KEYS_VARIABLE, worker.payload_keys_secret_ref))
    env.extend(dump(var) for var in worker.env or ())
    return env


def termination_grace_seconds(pool: Pool) -> int:
    return math.ceil(pool.spec.worker.lease_seconds) + GRACE_BEYOND_LEASE_SECONDS


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _tmp_mount() -> dict[str, Any]:
    return {"name": "tmp", "mountPath": "/tmp"}  # noqa: S108 (an emptyDir)


def _container(pool: Pool, image: str) -> dict[str, Any]:
    worker = pool.spec.worker
    mounts = [_tmp_mount()]
    if worker.templates_config_map:
        mounts.append({"name": "templates", "mountPath": TEMPLATES_DIR, "readOnly": True})
    mounts.extend(dump(mount) for mount in worker.volume_mounts or ())
    container: dict[str, Any] = {
        "name": "worker",
        "image": worker.image or image,
        "args": ["worker"],
        "env": worker_env(pool),
        "ports": [{"name": "metrics", "containerPort": WORKER_METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 2),
        "resources": worker.resources.model_dump(),
        "securityContext": _security_context(),
        "terminationMessagePolicy": TERMINATION_MESSAGES,
        "volumeMounts": mounts,
    }
    if worker.env_from:
        container["envFrom"] = [dump(source) for source in worker.env_from]
    if worker.image_pull_policy:
        container["imagePullPolicy"] = worker.image_pull_policy
    return container


def migrate_container(pool: Pool, image: str) -> dict[str, Any]:
    """The init container that creates or upgrades the schema before the worker starts.

    `leasebox migrate` takes an advisory lock, so the pods of a rollout migrate one at a
    time and all but the first find nothing to do; it exits 1 (the pod retries) while the
    database is unreachable, and 2 on a bad setting.
    """
    worker = pool.spec.worker
    container: dict[str, Any] = {
        "name": "migrate",
        "image": worker.image or image,
        "args": ["migrate", "--schema", pool.spec.database.schema_name],
        "env": [
            _secret_env(DSN_VARIABLE, pool.spec.database.secret_ref),
            {"name": config.LOG_FORMAT.variable, "value": worker.log_format},
        ],
        "resources": worker.resources.model_dump(),
        "securityContext": _security_context(),
        "terminationMessagePolicy": TERMINATION_MESSAGES,
        "volumeMounts": [_tmp_mount()],
    }
    if worker.image_pull_policy:
        container["imagePullPolicy"] = worker.image_pull_policy
    return container


def _pod_spec(pool: Pool, image: str) -> dict[str, Any]:
    worker = pool.spec.worker
    template = worker.pod_template.spec if worker.pod_template else None
    custom: dict[str, Any] = dump(template) or {}
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    if worker.templates_config_map:
        volumes.append({"name": "templates", "configMap": {"name": worker.templates_config_map}})
    volumes.extend(custom.pop("volumes", []))
    pod: dict[str, Any] = {
        **custom,  # scheduling fields only: the model has nothing that loosens security
        "containers": [_container(pool, image)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_seconds(pool),
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if pool.spec.database.migrations == "Auto":
        pod["initContainers"] = [migrate_container(pool, image)]
    if worker.service_account_name:
        pod["serviceAccountName"] = worker.service_account_name
    return pod


def _pod_metadata(pool: Pool) -> dict[str, Any]:
    template = pool.spec.worker.pod_template
    meta = template.metadata if template and template.metadata else None
    labels = {**(meta.labels if meta and meta.labels else {}), **pod_labels(pool)}
    annotations = {
        **(meta.annotations if meta and meta.annotations else {}),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(WORKER_METRICS_PORT),
    }
    return {"labels": labels, "annotations": annotations}


def deployment(pool: Pool, *, image: str) -> dict[str, Any]:
    """The worker Deployment, without `replicas`: the scaler owns it (through `/scale`)."""
    return {
        "apiVersion": CHILD_RESOURCES["Deployment"][0],
        "kind": "Deployment",
        "metadata": {
            "name": pool.deployment_name,
            "namespace": pool.namespace,
            "labels": pod_labels(pool),
        },
        "spec": {
            "selector": {"matchLabels": selector_labels(pool)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 3,
            "template": {"metadata": _pod_metadata(pool), "spec": _pod_spec(pool, image)},
        },
    }


def pod_disruption_budget(pool: Pool) -> dict[str, Any]:
    """Voluntary evictions take one worker at a time, so drains never empty the pool."""
    return {
        "apiVersion": CHILD_RESOURCES["PodDisruptionBudget"][0],
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": pool.deployment_name,
            "namespace": pool.namespace,
            "labels": pod_labels(pool),
        },
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(pool)}},
    }


def pod_monitor(pool: Pool) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor for the workers' metrics port."""
    return {
        "apiVersion": CHILD_RESOURCES["PodMonitor"][0],
        "kind": "PodMonitor",
        "metadata": {
            "name": pool.deployment_name,
            "namespace": pool.namespace,
            "labels": {**pod_labels(pool), **pool.spec.monitoring.labels},
        },
        "spec": {
            "selector": {"matchLabels": selector_labels(pool)},
            "podMetricsEndpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    # Worker series carry the pool's name, as the pool alerts match on it.
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_leasebox_dev_pool"],
                            "targetLabel": "pool",
                            "action": "replace",
                        }
                    ],
                }
            ],
        },
    }


def prometheus_rule(pool: Pool, runbook_base_url: str = alerts.RUNBOOK_BASE) -> dict[str, Any]:
    """The pool's PrometheusRule: the chart's alerts, narrowed to this pool."""
    return {
        "apiVersion": CHILD_RESOURCES["PrometheusRule"][0],
        "kind": "PrometheusRule",
        "metadata": {
            "name": pool.deployment_name,
            "namespace": pool.namespace,
            "labels": {**pod_labels(pool), **pool.spec.monitoring.labels},
        },
        "spec": {
            "groups": alerts.pool_groups(pool.namespace, pool.name, runbook_base_url),
        },
    }


def clamp_replicas(current: int | None, pool: Pool) -> int:
    """Replicas inside the spec's bounds; a new Deployment starts at minReplicas."""
    scaling = pool.spec.scaling
    if current is None:
        return scaling.min_replicas
    return max(scaling.min_replicas, min(scaling.max_replicas, current))
