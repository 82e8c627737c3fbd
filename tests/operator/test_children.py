"""The manifests a pool owns: secrets by reference, restricted pods, SLA-built alerts."""

from __future__ import annotations

import re
from typing import Any

from leasebox_operator import children
from leasebox_operator.children import Pool
from leasebox_operator.metrics import OperatorMetrics
from leasebox_operator.models import PoolSpec

IMAGE = "example.org/leasebox:1"


def _pool(**spec: Any) -> Pool:
    base: dict[str, Any] = {
        "kinds": ["otp", "invite"],
        "database": {"secretRef": {"name": "db"}},
        "provider": {"secretRef": {"name": "mail", "key": "smtp"}},
    }
    return Pool("mail", "otp", PoolSpec.model_validate(base | spec))


def _env(manifest: dict[str, Any]) -> dict[str, Any]:
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}


def test_worker_gets_dsn_and_provider_url_by_secret_reference_only() -> None:
    env = _env(children.deployment(_pool(), image=IMAGE, replicas=1))
    assert env["LEASEBOX_DSN"] == {"secretKeyRef": {"name": "db", "key": "dsn"}}
    assert env["LEASEBOX_PROVIDER_URL"] == {"secretKeyRef": {"name": "mail", "key": "smtp"}}
    assert env["LEASEBOX_KINDS"] == "otp,invite"
    assert env["LEASEBOX_LEASE_SECONDS"] == "45"
    assert env["LEASEBOX_METRICS_PORT"] == "9108"
    settings = {"LEASEBOX_CONCURRENCY", "LEASEBOX_MAX_ATTEMPTS", "LEASEBOX_BACKOFF_BASE",
                "LEASEBOX_BACKOFF_MAX", "LEASEBOX_SCHEMA", "LEASEBOX_LOG_FORMAT"}  # fmt: skip
    assert settings <= set(env)
    assert "LEASEBOX_TEMPLATES" not in env
    assert "LEASEBOX_PAYLOAD_KEYS" not in env


def test_templates_config_map_is_mounted_and_payload_keys_come_from_a_secret() -> None:
    pool = _pool(worker={"templatesConfigMap": "tpl", "payloadKeysSecretRef": {"name": "keys"}})
    manifest = children.deployment(pool, image=IMAGE, replicas=1)
    env = _env(manifest)
    assert env["LEASEBOX_TEMPLATES"] == children.TEMPLATES_DIR
    assert env["LEASEBOX_PAYLOAD_KEYS"] == {"secretKeyRef": {"name": "keys", "key": "keys"}}
    pod = manifest["spec"]["template"]["spec"]
    assert {"name": "templates", "configMap": {"name": "tpl"}} in pod["volumes"]


def test_worker_pod_is_restricted_probed_and_outlives_its_lease_on_shutdown() -> None:
    manifest = children.deployment(_pool(worker={"leaseSeconds": 50.5}), image=IMAGE, replicas=2)
    pod = manifest["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == IMAGE
    assert container["args"] == ["worker"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["ports"][0]["containerPort"] == 9108
    assert pod["terminationGracePeriodSeconds"] > 50.5
    assert manifest["spec"]["replicas"] == 2


def test_pod_labels_name_the_pool_and_the_selector_matches_them() -> None:
    pool = _pool()
    manifest = children.deployment(pool, image=IMAGE, replicas=1)
    labels = manifest["spec"]["template"]["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/name": "leasebox-worker", "app.kubernetes.io/instance": "otp",
        "app.kubernetes.io/managed-by": "leasebox-operator", "leasebox.dev/pool": "otp",
    }  # fmt: skip
    selector = manifest["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    pdb = children.pod_disruption_budget(pool)
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert children.pod_monitor(pool)["spec"]["selector"]["matchLabels"] == selector


def test_hash_follows_the_pod_template_but_not_the_replica_count() -> None:
    def digest(pool: Pool, replicas: int) -> str:
        manifest = children.deployment(pool, image=IMAGE, replicas=replicas)
        return str(manifest["metadata"]["annotations"][children.HASH_ANNOTATION])

    assert digest(_pool(), 1) == digest(_pool(), 7)
    assert digest(_pool(), 1) != digest(_pool(worker={"concurrency": 8}), 1)


def test_prometheus_rule_uses_the_pools_sla_and_only_exported_metric_names() -> None:
    pool = _pool(sla={"oldestPendingAgeSeconds": 45})
    rules = children.prometheus_rule(pool)["spec"]["groups"][0]["rules"]
    breach = next(r for r in rules if r["alert"] == "LeaseboxPoolSLABreached")
    assert breach["expr"].endswith("> 45")
    assert 'namespace="mail",pool="otp"' in breach["expr"]
    exported = {m.name for m in OperatorMetrics().registry.collect()}
    exported |= {f"{name}_total" for name in exported}
    for rule in rules:
        for name in re.findall(r"\b(leasebox_[a-z_]+)\b", rule["expr"]):
            assert name in exported, f"{rule['alert']} uses unknown metric {name}"


def test_the_pod_monitor_labels_worker_series_with_the_pool() -> None:
    pool = _pool()
    endpoint = children.pod_monitor(pool)["spec"]["podMetricsEndpoints"][0]
    assert endpoint["relabelings"] == [{
        "sourceLabels": ["__meta_kubernetes_pod_label_leasebox_dev_pool"],
        "targetLabel": "pool",
        "action": "replace",
    }]  # fmt: skip
    template = children.deployment(pool, image=IMAGE, replicas=1)["spec"]["template"]
    assert template["metadata"]["labels"]["leasebox.dev/pool"] == pool.name


def test_monitoring_labels_reach_pod_monitor_and_rule() -> None:
    pool = _pool(monitoring={"podMonitor": True, "labels": {"release": "prom"}})
    assert children.pod_monitor(pool)["metadata"]["labels"]["release"] == "prom"
    assert children.prometheus_rule(pool)["metadata"]["labels"]["release"] == "prom"


def test_replicas_start_at_min_and_stay_within_bounds() -> None:
    pool = _pool(scaling={"minReplicas": 2, "maxReplicas": 5})
    assert children.clamp_replicas(None, pool) == 2
    assert children.clamp_replicas(9, pool) == 5
    assert children.clamp_replicas(0, pool) == 2
    assert children.clamp_replicas(3, pool) == 3
