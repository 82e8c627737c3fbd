"""The manifests a pool owns: secrets by reference, restricted pods, the chart's alerts.

Every field of `spec.worker.podTemplate` (and the worker's extra env, envFrom and volume
mounts) is checked to reach the Deployment, and the Deployment with all of them set is
validated as Kubernetes validates it (kubernetes-validate, strict).
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from leasebox_operator import alerts, children
from leasebox_operator.children import Pool
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
    env = _env(children.deployment(_pool(), image=IMAGE))
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
    manifest = children.deployment(pool, image=IMAGE)
    env = _env(manifest)
    assert env["LEASEBOX_TEMPLATES"] == children.TEMPLATES_DIR
    assert env["LEASEBOX_PAYLOAD_KEYS"] == {"secretKeyRef": {"name": "keys", "key": "keys"}}
    pod = manifest["spec"]["template"]["spec"]
    assert {"name": "templates", "configMap": {"name": "tpl"}} in pod["volumes"]


def test_worker_pod_is_restricted_probed_and_outlives_its_lease_on_shutdown() -> None:
    manifest = children.deployment(_pool(worker={"leaseSeconds": 50}), image=IMAGE)
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
    assert pod["terminationGracePeriodSeconds"] == 65
    assert _env(manifest)["LEASEBOX_GRACE"] == "50"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "replicas" not in manifest["spec"]  # the scaler's field


def test_pod_labels_name_the_pool_and_the_selector_matches_them() -> None:
    pool = _pool()
    manifest = children.deployment(pool, image=IMAGE)
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


def test_the_pool_rule_has_the_charts_alerts_narrowed_to_the_pool() -> None:
    pool = _pool(sla={"oldestPendingAgeSeconds": 45})
    groups = children.prometheus_rule(pool)["spec"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    chart = {r["alert"]: r for g in alerts.rule_groups() for r in g["rules"] if "alert" in r}
    # About the operator, or about a provider account (read from recorded series): fleet-wide.
    fleet = {"LeaseboxOperatorDown"} | {n for n, r in chart.items() if "leasebox:" in r["expr"]}
    assert "LeaseboxBounceRateCritical" in fleet
    assert {r["alert"] for r in rules} == set(chart) - fleet
    for rule in rules:
        source = chart[rule["alert"]]
        assert rule["annotations"] == source["annotations"]  # the same runbook_url
        assert rule["labels"] == source["labels"]
        assert rule["expr"] == alerts.narrow(source["expr"], "mail", "otp")
        for selector in re.findall(r"leasebox_[a-z_]+\{[^}]*\}", rule["expr"]):
            assert selector.split("{", 1)[1].startswith('namespace="mail",pool="otp"')


def test_the_pod_monitor_labels_worker_series_with_the_pool() -> None:
    pool = _pool()
    endpoint = children.pod_monitor(pool)["spec"]["podMetricsEndpoints"][0]
    assert endpoint["relabelings"] == [{
        "sourceLabels": ["__meta_kubernetes_pod_label_leasebox_dev_pool"],
        "targetLabel": "pool",
        "action": "replace",
    }]  # fmt: skip
    template = children.deployment(pool, image=IMAGE)["spec"]["template"]
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


FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "identity"}, "annotations": {"mesh.example/inject": "true"}},
    "spec": {
        "nodeSelector": {"pool": "mail"},
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "otp"}}}}]}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mail",
                         "effect": "NoSchedule"}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway"}],
        "priorityClassName": "mail-critical",
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [{"name": "ca", "secret": {"secretName": "smtp-ca"}},
                    {"name": "extra", "configMap": {"name": "extra-templates"}}],
    },
}  # fmt: skip
FULL_WORKER: dict[str, Any] = {
    "podTemplate": FULL_TEMPLATE,
    "env": [{"name": "LEASEBOX_LOG_LEVEL", "value": "debug"},
            {"name": "SSL_CERT_FILE", "value": "/etc/ca/ca.crt"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    "envFrom": [{"configMapRef": {"name": "mail-settings"}}],
    "volumeMounts": [{"name": "ca", "mountPath": "/etc/ca", "readOnly": True}],
}  # fmt: skip


def _full() -> dict[str, Any]:
    return children.deployment(_pool(worker=FULL_WORKER), image=IMAGE)


@pytest.mark.parametrize(
    "field",
    ["nodeSelector", "affinity", "tolerations", "topologySpreadConstraints",
     "priorityClassName", "imagePullSecrets"],
)  # fmt: skip
def test_each_scheduling_field_of_the_pod_template_reaches_the_deployment(field: str) -> None:
    assert _full()["spec"]["template"]["spec"][field] == FULL_TEMPLATE["spec"][field]


def test_pod_template_labels_annotations_and_volumes_are_merged_under_the_operators() -> None:
    template = _full()["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "identity"
    assert template["metadata"]["labels"]["leasebox.dev/pool"] == "otp"
    assert template["metadata"]["annotations"]["mesh.example/inject"] == "true"
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    volumes = [v["name"] for v in template["spec"]["volumes"]]
    assert volumes == ["tmp", "ca", "extra"]


def test_extra_env_env_from_and_mounts_reach_the_worker_container() -> None:
    container = _full()["spec"]["template"]["spec"]["containers"][0]
    names = [v["name"] for v in container["env"]]
    assert names[-3:] == ["LEASEBOX_LOG_LEVEL", "SSL_CERT_FILE", "NODE"]
    assert names[0] == "LEASEBOX_DSN"  # the operator's come first and stay
    assert container["envFrom"] == [{"configMapRef": {"name": "mail-settings"}}]
    assert {"name": "ca", "mountPath": "/etc/ca", "readOnly": True} in container["volumeMounts"]


@pytest.mark.parametrize("kubernetes_version", ["1.29.0", "1.35.0"])
def test_a_deployment_with_every_customisation_passes_strict_kubernetes_validation(
    kubernetes_version: str,
) -> None:
    kubernetes_validate.validate(_full(), kubernetes_version, strict=True)


def test_the_restricted_security_context_survives_every_customisation() -> None:
    pod = _full()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"] + pod["initContainers"]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)


@pytest.mark.parametrize(
    ("worker", "message"),
    [
        ({"podTemplate": {"spec": {"securityContext": {"runAsUser": 0}}}}, "Extra inputs"),
        ({"podTemplate": {"spec": {"hostNetwork": True}}}, "Extra inputs"),
        ({"podTemplate": {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}},
         "Extra inputs"),
        ({"env": [{"name": "LEASEBOX_DSN", "value": "postgresql://x"}]}, "operator sets"),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "must name a volume"),
        ({"podTemplate": {"metadata": {"labels": {"leasebox.dev/pool": "other"}}}},
         "are the operator's"),
    ],
)  # fmt: skip
def test_a_template_that_would_loosen_or_break_the_pod_is_refused(
    worker: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        _pool(worker=worker)


def test_the_migrate_init_container_runs_before_the_worker_unless_migrations_are_manual() -> None:
    pod = children.deployment(_pool(), image=IMAGE)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["migrate", "--schema", "leasebox"]
    assert init["image"] == IMAGE
    assert init["env"][0] == {"name": "LEASEBOX_DSN", "valueFrom": {
        "secretKeyRef": {"name": "db", "key": "dsn"}}}  # fmt: skip
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    manual = _pool(database={"secretRef": {"name": "db"}, "migrations": "Manual"})
    pod = children.deployment(manual, image=IMAGE)["spec"]["template"]["spec"]
    assert "initContainers" not in pod
