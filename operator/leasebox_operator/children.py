"""The objects a pool owns, built as plain manifests from its spec.

Pure functions: a spec in, a manifest out. The handlers add ownership (`kopf.adopt`) and
send them; tests read them without a cluster. Secrets reach the workers by reference
(`secretKeyRef`), never by value, so nothing secret passes through the operator into a
manifest. A hash of each manifest travels as an annotation, so a reconcile patches only
what changed and a changed pod template rolls out.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from leasebox_operator.models import PoolSpec, SecretKeyRef

WORKER_METRICS_PORT = 9108
TEMPLATES_DIR = "/etc/leasebox/templates"
HASH_ANNOTATION = "leasebox.dev/spec-hash"
POOL_LABEL = "leasebox.dev/pool"
MANAGED_BY = "leasebox-operator"
# Workers stop claiming on SIGTERM and finish in-flight sends; the grace period must
# outlast a lease so that a send never dies holding one it could still complete.
GRACE_BEYOND_LEASE_SECONDS = 15
MAX_NAME_LENGTH = 56  # leaves room for "-worker" in a 63-character label value


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


def pod_labels(pool: Pool) -> dict[str, str]:
    return {
        **selector_labels(pool),
        "app.kubernetes.io/managed-by": MANAGED_BY,
        POOL_LABEL: pool.name,
    }


def spec_hash(manifest: dict[str, Any]) -> str:
    """A short, stable digest of a manifest."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _with_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = spec_hash(manifest)
    return manifest


def _secret_env(name: str, ref: SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def _number(value: float) -> str:
    return f"{value:g}"


def worker_env(pool: Pool) -> list[dict[str, Any]]:
    """The worker's environment: settings by value, secrets by reference."""
    spec, worker = pool.spec, pool.spec.worker
    env = [
        _secret_env("LEASEBOX_DSN", spec.database.secret_ref),
        _secret_env("LEASEBOX_PROVIDER_URL", spec.provider.secret_ref),
        {"name": "LEASEBOX_SCHEMA", "value": spec.database.schema_name},
        {"name": "LEASEBOX_KINDS", "value": ",".join(spec.kinds)},
        {"name": "LEASEBOX_CONCURRENCY", "value": str(worker.concurrency)},
        {"name": "LEASEBOX_LEASE_SECONDS", "value": _number(worker.lease_seconds)},
        {"name": "LEASEBOX_MAX_ATTEMPTS", "value": str(worker.max_attempts)},
        {"name": "LEASEBOX_BACKOFF_BASE", "value": _number(worker.backoff_base_seconds)},
        {"name": "LEASEBOX_BACKOFF_MAX", "value": _number(worker.backoff_max_seconds)},
        {"name": "LEASEBOX_METRICS_PORT", "value": str(WORKER_METRICS_PORT)},
        {"name": "LEASEBOX_LOG_FORMAT", "value": worker.log_format},
    ]
    if worker.templates_config_map:
        env.append({"name": "LEASEBOX_TEMPLATES", "value": TEMPLATES_DIR})
    if worker.payload_keys_secret_ref:
        env.append(_secret_env("LEASEBOX_PAYLOAD_KEYS", worker.payload_keys_secret_ref))
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


def _container(pool: Pool, image: str) -> dict[str, Any]:
    worker = pool.spec.worker
    container: dict[str, Any] = {
        "name": "worker",
        "image": worker.image or image,
        "args": ["worker"],
        "env": worker_env(pool),
        "ports": [{"name": "metrics", "containerPort": WORKER_METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 2),
        "resources": worker.resources.model_dump(),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # noqa: S108 (an emptyDir)
    }
    if worker.image_pull_policy:
        container["imagePullPolicy"] = worker.image_pull_policy
    if worker.templates_config_map:
        container["volumeMounts"].append(
            {"name": "templates", "mountPath": TEMPLATES_DIR, "readOnly": True}
        )
    return container


def _pod_spec(pool: Pool, image: str) -> dict[str, Any]:
    worker = pool.spec.worker
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    if worker.templates_config_map:
        volumes.append({"name": "templates", "configMap": {"name": worker.templates_config_map}})
    pod: dict[str, Any] = {
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
    if worker.service_account_name:
        pod["serviceAccountName"] = worker.service_account_name
    return pod


def deployment(pool: Pool, *, image: str, replicas: int) -> dict[str, Any]:
    """The worker Deployment; `replicas` is the caller's (the poll loop owns scaling)."""
    labels = pod_labels(pool)
    manifest: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": pool.deployment_name, "namespace": pool.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector_labels(pool)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(WORKER_METRICS_PORT),
                    },
                },
                "spec": _pod_spec(pool, image),
            },
        },
    }
    _with_hash(manifest)
    manifest["spec"]["replicas"] = replicas
    return manifest


def pod_disruption_budget(pool: Pool) -> dict[str, Any]:
    """Voluntary evictions take one worker at a time, so drains never empty the pool."""
    return _with_hash(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {
                "name": pool.deployment_name,
                "namespace": pool.namespace,
                "labels": pod_labels(pool),
            },
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(pool)}},
        }
    )


def pod_monitor(pool: Pool) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor for the workers' metrics port."""
    return _with_hash(
        {
            "apiVersion": "monitoring.coreos.com/v1",
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
    )


def _selector(pool: Pool, **extra: str) -> str:
    labels = {"namespace": pool.namespace, "pool": pool.name, **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def alert_rules(pool: Pool) -> list[dict[str, Any]]:
    """The pool's alerts, on the operator's metrics, with the pool's own SLA."""
    sla = pool.spec.sla.oldest_pending_age_seconds
    sel = _selector(pool)
    labels = {"namespace": pool.namespace, "pool": pool.name}
    return [
        {
            "alert": "LeaseboxPoolSLABreached",
            "expr": f"time() - max(leasebox_pool_oldest_pending_timestamp_seconds{sel}) > {sla:g}",
            "for": "1m",
            "labels": {**labels, "severity": "critical"},
            "annotations": {
                "summary": f"OutboxWorkerPool {pool.name}: oldest pending message past its SLA",
                "description": f"The oldest pending message of pool {pool.namespace}/{pool.name}"
                f" is older than the {sla:g}s SLA.",
            },
        },
        {
            "alert": "LeaseboxPoolDeadLetters",
            "expr": f"delta(leasebox_pool_messages{_selector(pool, state='dead')}[15m]) > 0",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"OutboxWorkerPool {pool.name}: new dead letters",
                "description": "Messages became dead letters in the last 15 minutes; inspect "
                "them with `leasebox dead-letters list`.",
            },
        },
        {
            "alert": "LeaseboxPoolAtMaxReplicas",
            "expr": f"leasebox_pool_desired_replicas{sel} >= leasebox_pool_max_replicas{sel}",
            "for": "15m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"OutboxWorkerPool {pool.name}: pinned at maxReplicas",
                "description": "The scaling policy wants at least maxReplicas for 15 minutes; "
                "raise maxReplicas or look for a slow provider.",
            },
        },
        {
            "alert": "LeaseboxPoolPollFailing",
            "expr": f"increase(leasebox_operator_poll_errors_total{sel}[5m]) > 0",
            "for": "5m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"OutboxWorkerPool {pool.name}: backlog polls failing",
                "description": "The operator cannot read the backlog; replicas are frozen. "
                "See the pool's DatabaseReachable condition.",
            },
        },
    ]


def prometheus_rule(pool: Pool) -> dict[str, Any]:
    """A per-pool PrometheusRule built from the pool's SLA."""
    return _with_hash(
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": pool.deployment_name,
                "namespace": pool.namespace,
                "labels": {**pod_labels(pool), **pool.spec.monitoring.labels},
            },
            "spec": {
                "groups": [
                    {
                        "name": f"leasebox-pool-{pool.namespace}-{pool.name}",
                        "rules": alert_rules(pool),
                    }
                ],
            },
        }
    )


def clamp_replicas(current: int | None, pool: Pool) -> int:
    """Replicas inside the spec's bounds; a new Deployment starts at minReplicas."""
    scaling = pool.spec.scaling
    if current is None:
        return scaling.min_replicas
    return max(scaling.min_replicas, min(scaling.max_replicas, current))
