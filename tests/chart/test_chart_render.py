"""The Helm chart renders, lints and validates, with default and with all-features values.

Rendering and linting use real Helm (helm-python-sdk). Built-in kinds are validated with
kubernetes-validate in strict mode for the oldest and newest Kubernetes versions we support;
OutboxWorkerPool objects are validated against the CRD's own openAPIV3Schema.
"""

from __future__ import annotations

import copy
import http.server
import os
import re
import subprocess
import sys
import textwrap
import threading
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from support.chart import (
    CHART,
    CRD_COPY,
    CRD_SOURCE,
    CUSTOM_KINDS,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    RELEASE,
    ROOT,
    STANDARD_LABELS,
    VALUE_SETS,
    all_features_values,
    of_kind,
    one,
    operator_container,
    pod_specs,
    render,
    render_notes,
)

# --- linting and validation ----------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_the_chart_lints_without_errors_or_warnings(value_set: str) -> None:
    report = helm.lint(CHART, copy.deepcopy(VALUE_SETS[value_set]), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == []
    assert problems == []


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_every_rendered_manifest_passes_strict_kubernetes_validation(
    rendered: list[dict[str, Any]], kubernetes_version: str
) -> None:
    failures = []
    checked = 0
    for obj in rendered:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as e:
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            failures.append(f"{name}: {getattr(e, 'message', e)}")
        checked += 1
    assert failures == []
    assert checked >= 5


def test_kubernetes_validation_would_catch_an_unknown_field() -> None:
    deployment = copy.deepcopy(one(render(), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def _strict_crd_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD schema as the API server applies it: unknown fields are errors, not pruned."""
    schema = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("nullable") and "type" in node:
                node["type"] = [node["type"], "null"]
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


def crd_validator() -> jsonschema.Draft7Validator:
    if not CRD_SOURCE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CRD_SOURCE.relative_to(ROOT)} is missing")
        pytest.skip(f"{CRD_SOURCE.relative_to(ROOT)} has not been generated yet")
    crd = yaml.safe_load(CRD_SOURCE.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema = _strict_crd_schema(version["schema"]["openAPIV3Schema"])
    # The API server checks metadata itself; the CRD schema leaves it open.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def test_rendered_pools_match_the_crd_schema() -> None:
    validator = crd_validator()
    pools = of_kind(render(all_features_values()), "OutboxWorkerPool")
    assert [pool["metadata"]["name"] for pool in pools] == ["otp", "invites"]
    for pool in pools:
        assert pool["apiVersion"] == "leasebox.dev/v1alpha1"
        errors = [e.message for e in validator.iter_errors(pool)]
        assert errors == [], pool["metadata"]["name"]


def test_the_crd_schema_check_rejects_a_pool_with_an_unknown_field() -> None:
    validator = crd_validator()
    pool = copy.deepcopy(of_kind(render(all_features_values()), "OutboxWorkerPool")[0])
    pool["spec"]["slaa"] = {"oldestPendingAgeSeconds": 60}
    assert list(validator.iter_errors(pool))


# --- values and their schema ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"operator": {"logFormat": "xml"}}, "logFormat"),
        ({"operator": {"verbose": "yes"}}, "verbose"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"operator": {"metrics": {"port": 70000}}}, "port"),
        ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "watchNamespaces"),
        ({"crds": {"install": "yes"}}, "install"),
        ({"serviceMonitor": {"interval": "often"}}, "interval"),
        ({"pools": [{"name": "otp"}]}, "spec"),
        ({"operatorr": {}}, "operatorr"),
        ({"operator": {"replicas": 0}}, "replicas"),
        ({"rbac": {"secretNames": ["Not A Name"]}}, "secretNames"),
    ],
)
def test_bad_values_are_rejected_with_a_message_naming_the_field(
    values: dict[str, Any], named: str
) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert named in str(caught.value)


def test_the_default_and_all_features_values_satisfy_the_values_schema() -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(None)
        chart.validate_schema(all_features_values())


def _documented_keys(lines: list[str]) -> tuple[set[str], set[str]]:
    """Key paths of values.yaml, and those with a `# --` comment block directly above."""
    keys: set[str] = set()
    documented: set[str] = set()
    stack: list[tuple[int, str]] = []
    in_list_at: int | None = None
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z_][\w.-]*):(\s|$)", line)
        if not match:
            item = re.match(r"^(\s*)- ", line)
            if item and in_list_at is None:
                in_list_at = len(item.group(1))
            continue
        indent = len(match.group(1))
        if in_list_at is not None and indent > in_list_at:
            continue  # keys of list items are example data, not values
        in_list_at = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        path = ".".join(name for _, name in stack)
        keys.add(path)
        above = number - 1
        block: list[str] = []
        while above >= 0 and lines[above].strip().startswith("#"):
            block.insert(0, lines[above].strip())
            above -= 1
        if block and block[0].startswith("# --"):
            documented.add(path)
    return keys, documented


def _yaml_key_paths(node: Any, prefix: str = "") -> set[str]:
    paths: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}{key}"
            paths.add(path)
            paths |= _yaml_key_paths(value, f"{path}.")
    return paths


def test_every_values_key_has_a_comment() -> None:
    text = (CHART / "values.yaml").read_text()
    keys, documented = _documented_keys(text.splitlines())
    assert keys == _yaml_key_paths(yaml.safe_load(text)), "the key scan missed keys"
    assert sorted(keys - documented) == []


def test_the_values_comment_check_notices_an_undocumented_key() -> None:
    lines = ["# -- documented", "a: 1", "b:", "  # -- nested", "  c: 2"]
    keys, documented = _documented_keys(lines)
    assert keys - documented == {"b"}


# --- what the chart renders ----------------------------------------------------------------


def test_default_values_render_the_operator_its_rbac_the_crd_and_the_test() -> None:
    kinds = sorted({obj["kind"] for obj in render()})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Pod",
        "Service",
        "ServiceAccount",
    ]


def test_all_features_values_render_every_optional_object() -> None:
    objects = render(all_features_values())
    kinds = {obj["kind"] for obj in objects}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    assert len(of_kind(objects, "OutboxWorkerPool")) == 2
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"):
        assert one(objects, kind)["metadata"]["namespace"] == "monitoring"


def test_every_resource_carries_the_standard_labels(rendered: list[dict[str, Any]]) -> None:
    for obj in rendered:
        labels = obj["metadata"].get("labels", {})
        missing = [label for label in STANDARD_LABELS if label not in labels]
        assert missing == [], f"{obj['kind']}/{obj['metadata']['name']}"
        assert labels["app.kubernetes.io/instance"] == RELEASE


def test_the_operator_runs_once_with_recreate_and_probes_kopf_liveness(
    rendered: list[dict[str, Any]],
) -> None:
    deployment = one(rendered, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = operator_container(rendered)
    assert container["args"][0] == "operator"
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz"
    assert ports[probe["port"]] == 8080
    assert ports["http-metrics"] == 9109
    assert "--metrics-port=9109" in container["args"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert "--log-format=json" in container["args"]


def test_the_operator_command_line_is_one_the_leasebox_cli_accepts(
    rendered: list[dict[str, Any]],
) -> None:
    from leasebox.cli.main import build_parser

    container = operator_container(rendered)
    assert "command" not in container  # the image's ENTRYPOINT, leasebox, runs
    args = build_parser().parse_args(container["args"])
    assert args.command == "operator"
    assert args.worker_image == container["image"]


def test_every_pod_runs_with_the_restricted_security_context(
    rendered: list[dict[str, Any]],
) -> None:
    specs = list(pod_specs(rendered))
    assert len(specs) == 2
    for name, spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["runAsNonRoot"] is True, name


def test_all_features_values_reach_the_operator_pod() -> None:
    values = all_features_values()
    objects = render(values)
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    container = operator_container(objects)
    assert container["image"] == "registry.example.com/leasebox/leasebox:0.1.0-rc.1"
    assert container["imagePullPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert spec["serviceAccountName"] == "leasebox-operator"
    assert spec["priorityClassName"] == "platform-critical"
    assert spec["nodeSelector"] == values["operator"]["nodeSelector"]
    assert spec["tolerations"] == values["operator"]["tolerations"]
    assert spec["affinity"] == values["operator"]["affinity"]
    assert pod["metadata"]["annotations"] == values["operator"]["podAnnotations"]
    assert pod["metadata"]["labels"]["example.com/tier"] == "platform"
    assert container["resources"] == values["operator"]["resources"]
    assert "--peering-name=leasebox-prod" in container["args"]
    assert "--standalone" not in container["args"]
    assert container["args"][-2:] == ["--verbose", "--priority=10"]
    assert f"--worker-image={container['image']}" in container["args"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LEASEBOX_OPERATOR_POOL_MAX_CONNECTIONS"] == "8"
    assert env["POD_ID"] is None  # from the downward API: kopf's identity
    assert {"name": "templates", "mountPath": "/etc/leasebox/templates", "readOnly": True} in (
        container["volumeMounts"]
    )


def test_an_image_digest_replaces_the_tag() -> None:
    digest = "sha256:" + "a" * 64
    container = operator_container(render({"image": {"digest": digest}}))
    assert container["image"] == f"ghcr.io/leasebox/leasebox@{digest}"


def test_the_image_tag_defaults_to_the_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert operator_container(render())["image"] == f"ghcr.io/leasebox/leasebox:{app_version}"


# --- the CRD ---------------------------------------------------------------------------------


def test_the_chart_copy_of_the_crd_equals_the_generated_crd() -> None:
    assert CRD_SOURCE.exists(), "crds/outboxworkerpools.leasebox.dev.yaml is missing"
    assert CRD_COPY.read_bytes() == CRD_SOURCE.read_bytes(), (
        "the chart's CRD copy is stale: run make crds"
    )


def test_the_rendered_crd_carries_the_crd_file_unchanged_and_is_kept() -> None:
    source = yaml.safe_load(CRD_COPY.read_text())
    crd = one(render(), "CustomResourceDefinition")
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["name"] == "outboxworkerpools.leasebox.dev"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_crd_can_be_left_out_or_released_on_uninstall() -> None:
    assert of_kind(render({"crds": {"install": False}}), "CustomResourceDefinition") == []
    crd = one(render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


# --- NOTES and helm test ---------------------------------------------------------------------


def test_the_notes_say_what_to_do_next() -> None:
    notes = render_notes()
    assert "kubectl get owp" in notes
    assert "kind: OutboxWorkerPool" in notes
    assert "/metrics" in notes
    assert "helm test leasebox" in notes


def test_the_pool_the_notes_suggest_matches_the_crd_schema() -> None:
    validator = crd_validator()
    notes = render_notes()
    block = notes.split("<<'POOL'\n", 1)[1].split("POOL\n", 1)[0]
    pool = yaml.safe_load(textwrap.dedent(block))
    assert pool["kind"] == "OutboxWorkerPool"
    assert [e.message for e in validator.iter_errors(pool)] == []


def _test_pod_command(objects: list[dict[str, Any]]) -> list[str]:
    pod = one(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command: list[str] = pod["spec"]["containers"][0]["command"]
    return command


def test_the_helm_test_pod_asks_the_operator_service_with_python() -> None:
    command = _test_pod_command(render())
    assert command[:2] == ["python", "-c"]
    assert command[3] == f"http://leasebox.{NAMESPACE}.svc:9109/metrics"


class _MetricsHandler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("body", "passes"),
    [
        (b"# HELP leasebox_pool_messages Messages by state\n", True),
        (b"# HELP python_info Python platform information\n", False),
    ],
)
def test_the_helm_test_script_passes_only_when_leasebox_metrics_answer(
    body: bytes, passes: bool
) -> None:
    handler = type("Handler", (_MetricsHandler,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        script = _test_pod_command(render())[2]
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        result = subprocess.run(
            [sys.executable, "-c", script, url, "1"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert (result.returncode == 0) is passes, result.stdout + result.stderr
