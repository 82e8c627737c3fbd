"""The chart's RBAC and monitoring: least privilege, peering, Secrets by name, and the
ServiceMonitor, PodMonitor, PrometheusRule and dashboard it ships."""

from __future__ import annotations

import json
from typing import Any

import yaml

from support.chart import (
    DASHBOARD_FILE,
    NAMESPACE,
    ROOT,
    RULES_FILE,
    all_features_values,
    of_kind,
    one,
    operator_container,
    pod_specs,
    render,
)

# --- RBAC ------------------------------------------------------------------------------------


def _rules_by_resource(role: dict[str, Any]) -> dict[str, set[str]]:
    verbs: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault(f"{group}/{resource}", set()).update(rule["verbs"])
    return verbs


# Exactly the verbs the operator uses (kopf's watches and patches, the official client's
# reads, creates, server-side applies and scale writes, Events created once); that each is
# needed is proven on the real API server (tests/cluster/test_rbac.py).
NAMESPACED_NEEDS = {
    "leasebox.dev/outboxworkerpools": {"list", "watch", "patch"},
    "leasebox.dev/outboxworkerpools/status": {"patch"},
    "apps/deployments": {"get", "list", "watch", "create", "patch"},
    "apps/deployments/scale": {"patch"},
    "policy/poddisruptionbudgets": {"get", "create", "patch"},
    "/secrets": {"get"},
    "/events": {"create"},
    "monitoring.coreos.com/podmonitors": {"get", "create", "patch", "delete"},
    "monitoring.coreos.com/prometheusrules": {"get", "create", "patch", "delete"},
}


def test_cluster_wide_mode_grants_exactly_what_the_operator_needs_in_a_cluster_role() -> None:
    objects = render({"rbac": {"aggregateClusterRoles": False}})
    assert of_kind(objects, "Role") == []
    role = one(objects, "ClusterRole")
    assert _rules_by_resource(role) == {
        **NAMESPACED_NEEDS,
        "apiextensions.k8s.io/customresourcedefinitions": {"list", "watch"},
    }
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "leasebox", "namespace": NAMESPACE}
    ]
    args = operator_container(objects)["args"]
    assert args[:3] == ["operator", "--all-namespaces", "--standalone"]
    assert not [a for a in args if a.startswith("--namespace")]


def test_namespaced_mode_renders_a_role_and_binding_in_each_watched_namespace() -> None:
    objects = render(
        {
            "operator": {"watchNamespaces": ["mail", "growth"], "peering": {"enabled": True}},
            "rbac": {"aggregateClusterRoles": False},
        }
    )
    roles = of_kind(objects, "Role")
    bindings = of_kind(objects, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["growth", "mail"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["growth", "mail"]
    for role in roles:
        assert _rules_by_resource(role) == {
            **NAMESPACED_NEEDS,
            "kopf.dev/kopfpeerings": {"list", "watch", "patch", "create"},
        }
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "leasebox",
        }
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    # Only CRD discovery stays cluster-wide.
    cluster_role = one(objects, "ClusterRole")
    assert _rules_by_resource(cluster_role) == {
        "apiextensions.k8s.io/customresourcedefinitions": {"list", "watch"}
    }
    args = operator_container(objects)["args"]
    assert args[:3] == ["operator", "--namespace=mail", "--namespace=growth"]
    assert "--all-namespaces" not in args
    from leasebox.cli.main import build_parser

    parsed = vars(build_parser().parse_args(args))
    assert ["mail", "growth"] in parsed.values()


def test_cluster_wide_peering_grants_cluster_peerings() -> None:
    objects = render({"operator": {"peering": {"enabled": True}}})
    role = next(r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"] == "leasebox")
    assert _rules_by_resource(role)["kopf.dev/clusterkopfpeerings"] == {
        "list",
        "watch",
        "patch",
        "create",
    }
    assert "--standalone" not in operator_container(objects)["args"]


def test_secret_reads_can_be_restricted_to_named_secrets() -> None:
    objects = render(
        {"rbac": {"secretNames": ["otp-db", "otp-mail"], "aggregateClusterRoles": False}}
    )
    (rule,) = [r for r in one(objects, "ClusterRole")["rules"] if r["resources"] == ["secrets"]]
    assert rule == {"apiGroups": [""], "resources": ["secrets"],
                    "resourceNames": ["otp-db", "otp-mail"], "verbs": ["get"]}  # fmt: skip


def test_several_operator_replicas_run_with_peering_random_priorities_and_its_crds() -> None:
    objects = render({"operator": {"replicas": 3}})
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    args = operator_container(objects)["args"]
    assert "--peering-name=leasebox" in args
    assert "--priority=random" in args
    assert "--standalone" not in args
    from leasebox.cli.main import build_parser

    assert build_parser().parse_args(args).priority > 0
    crds = {c["metadata"]["name"] for c in of_kind(objects, "CustomResourceDefinition")}
    assert crds == {"outboxworkerpools.leasebox.dev", "clusterkopfpeerings.kopf.dev",
                    "kopfpeerings.kopf.dev"}  # fmt: skip
    role = next(r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"] == "leasebox")
    assert "create" in _rules_by_resource(role)["kopf.dev/clusterkopfpeerings"]


def test_every_container_falls_back_to_its_logs_for_the_termination_message(
    rendered: list[dict[str, Any]],
) -> None:
    for name, spec in pod_specs(rendered):
        for container in spec["containers"]:
            assert container["terminationMessagePolicy"] == "FallbackToLogsOnError", name


def test_the_charts_rules_file_is_the_operators_rule_source() -> None:
    source = ROOT / "operator" / "leasebox_operator" / "rules" / "leasebox-rules.yaml"
    assert RULES_FILE.read_bytes() == source.read_bytes(), "run make crds"


def test_the_operator_links_pool_alerts_to_the_charts_runbooks() -> None:
    container = operator_container(
        render({"prometheusRule": {"runbookBaseUrl": "https://rb.example"}})
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LEASEBOX_OPERATOR_RUNBOOK_BASE_URL"] == "https://rb.example"


def test_no_rule_uses_a_wildcard(rendered: list[dict[str, Any]]) -> None:
    for role in of_kind(rendered, "ClusterRole") + of_kind(rendered, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]


def test_rbac_and_service_account_can_be_left_out() -> None:
    objects = render({"rbac": {"create": False}, "serviceAccount": {"create": False}})
    kinds = {obj["kind"] for obj in objects}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert "ServiceAccount" not in kinds
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == (
        "default"
    )


# --- monitoring ------------------------------------------------------------------------------


def test_the_service_monitor_scrapes_the_operator_and_keeps_the_pool_namespace_label() -> None:
    objects = render(all_features_values())
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["honorLabels"] is True
    assert endpoint["interval"] == "15s"
    assert endpoint["relabelings"][0] == {"targetLabel": "job", "replacement": "leasebox-operator",
                                          "action": "replace"}  # fmt: skip
    assert service["spec"]["selector"].items() <= (
        one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_pod_monitor_selects_operator_managed_workers_and_labels_their_pool() -> None:
    monitor = one(render(all_features_values()), "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "leasebox-worker",
        "app.kubernetes.io/managed-by": "leasebox-operator",
    }
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["path"] == "/metrics"
    pool_relabel = endpoint["relabelings"][0]
    assert pool_relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_leasebox_dev_pool"]
    assert pool_relabel["targetLabel"] == "pool"
    assert endpoint["relabelings"][1]["targetLabel"] == "node"


def test_the_pod_monitor_follows_the_watched_namespaces() -> None:
    monitor = one(
        render({"podMonitor": {"enabled": True}, "operator": {"watchNamespaces": ["mail"]}}),
        "PodMonitor",
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["mail"]}


def test_the_prometheus_rule_holds_the_rules_file_with_the_chart_runbook_base() -> None:
    rules_file = yaml.safe_load(RULES_FILE.read_text())
    rule = one(render(all_features_values()), "PrometheusRule")
    file_alerts = {r["alert"]: r for g in rules_file["groups"] for r in g["rules"] if "alert" in r}
    chart_alerts = {
        r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r
    }
    # The recording rules come as they are, unlabelled.
    file_records = [r for g in rules_file["groups"] for r in g["rules"] if "record" in r]
    assert file_records
    assert [r for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r] == file_records
    assert set(chart_alerts) == set(file_alerts) - {"LeaseboxLeaseLost"}
    for name, alert in chart_alerts.items():
        assert alert["expr"] == file_alerts[name]["expr"]
        assert alert.get("for") == file_alerts[name].get("for")
        assert alert["labels"] == {**file_alerts[name]["labels"], "team": "identity"}
        anchor = file_alerts[name]["annotations"]["runbook_url"].split("#")[1]
        assert alert["annotations"]["runbook_url"] == (
            f"https://runbooks.example.com/leasebox#{anchor}"
        )
        assert alert["annotations"]["summary"] == file_alerts[name]["annotations"]["summary"]


def test_the_default_prometheus_rule_keeps_every_alert_unchanged() -> None:
    rules_file = yaml.safe_load(RULES_FILE.read_text())
    rule = one(render({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    assert rule["spec"]["groups"] == rules_file["groups"]


def test_the_dashboard_config_map_holds_the_dashboard_for_the_grafana_sidecar() -> None:
    config_map = one(render(all_features_values()), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Leasebox"}
    assert json.loads(config_map["data"]["leasebox-pool.json"]) == json.loads(
        DASHBOARD_FILE.read_text()
    )


def test_pools_render_as_outbox_worker_pools_with_their_spec_unchanged() -> None:
    values = all_features_values()
    pools = of_kind(render(values), "OutboxWorkerPool")
    assert [p["metadata"].get("namespace") for p in pools] == [NAMESPACE, "growth"]
    for pool, item in zip(pools, values["pools"], strict=True):
        assert pool["spec"] == item["spec"]
    assert pools[0]["metadata"]["labels"]["example.com/criticality"] == "high"
    assert pools[1]["metadata"]["annotations"] == {"example.com/owner": "growth"}
