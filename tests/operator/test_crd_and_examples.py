"""The CRD stays generated from the models, structural and valid; examples validate.

`crds/` is checked in, so a model change without regenerating it fails here. Examples are
checked the way an API server with strict field validation would: against the CRD's
schema (unknown fields refused) and against its `x-kubernetes-validations`, which a real
CEL engine (cel-python) executes after defaulting, for every good and every bad example.
The models must agree: whatever the CRD refuses, the operator refuses too, and back.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from leasebox_operator.crd import crd_yaml, custom_resource_definition, openapi_schema
from leasebox_operator.errors import InvalidSpec
from leasebox_operator.models import cel_rules
from leasebox_operator.reconcile import parse_pool
from support import cel

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "outboxworkerpools.leasebox.dev.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BAD_EXAMPLES = sorted((Path(__file__).parent / "bad-examples").glob("*.yaml"))


def _nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    if not isinstance(node, dict):
        return
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _nodes(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _nodes(node[key], f"{path}[{key}]")


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused (kubectl's strict field validation)."""
    schema = copy.deepcopy(schema)
    for _, node in _nodes(schema):
        if "properties" in node and node is not schema["properties"].get("metadata"):
            node.setdefault("additionalProperties", False)
    return schema


def _validator() -> jsonschema.Draft4Validator:
    # OpenAPI 3.0's boolean exclusiveMinimum is draft 4's; x-kubernetes-* keys are ignored.
    return jsonschema.Draft4Validator(_strict(openapi_schema()))


def _load(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), f"{path.name} holds no object"
    return loaded


def test_checked_in_crd_is_exactly_what_the_models_generate() -> None:
    assert CRD_FILE.read_text(encoding="utf-8") == crd_yaml(), (
        "crds/ is stale: run `leasebox crd > crds/outboxworkerpools.leasebox.dev.yaml`"
    )


def test_crd_names_scope_and_subresources() -> None:
    crd = custom_resource_definition()
    assert crd["metadata"]["name"] == "outboxworkerpools.leasebox.dev"
    spec = crd["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "OutboxWorkerPool"
    assert spec["names"]["shortNames"] == ["owp"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}  # fmt: skip


def test_printer_columns_put_the_summary_first_and_details_at_priority_one() -> None:
    (version,) = custom_resource_definition()["spec"]["versions"]
    columns = {c["name"]: c.get("priority", 0) for c in version["additionalPrinterColumns"]}
    assert [n for n, p in columns.items() if p == 0] == [
        "Kinds", "Ready", "Replicas", "Pending", "Oldest", "SLA", "Age"]  # fmt: skip
    assert [n for n, p in columns.items() if p == 1] == [
        "Desired", "Dead", "Mode", "Paused", "Status"]  # fmt: skip
    types = {c["name"]: c["type"] for c in version["additionalPrinterColumns"]}
    assert types["Kinds"] == "string"  # the status line, not the JSON array of spec.kinds
    assert types["Oldest"] == types["SLA"] == "integer"


def test_the_spec_has_no_floating_point_fields() -> None:
    spec = openapi_schema()["properties"]["spec"]
    floats = [path for path, node in _nodes(spec) if node.get("type") == "number"]
    assert floats == []


def test_crd_schema_is_structural() -> None:
    text = yaml.safe_dump(openapi_schema())
    assert "$ref" not in text
    assert "$defs" not in text
    assert "title:" not in text
    for path, node in _nodes(openapi_schema()):
        typed = "type" in node or node.get("x-kubernetes-int-or-string") is True
        assert typed, f"schema node {path or '<root>'} has no type"
        assert node.get("additionalProperties") is not False, f"{path}: additionalProperties"
        assert "uniqueItems" not in node, f"{path}: uniqueItems is not allowed"
        assert not isinstance(node.get("exclusiveMinimum"), int | float) or isinstance(
            node.get("exclusiveMinimum"), bool
        ), f"{path}: exclusiveMinimum must be boolean in OpenAPI v3.0"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, f"{path}: untyped anyOf"


def test_every_cel_rule_of_the_models_is_in_the_crd_and_compiles() -> None:
    declared = {r.rule for rules in cel_rules().values() for r in rules}
    carried = [rule for _, rule in cel.rules(openapi_schema())]
    assert set(carried) == declared
    assert "self.minReplicas <= self.maxReplicas" in declared
    for rule in declared:
        cel.validate({"x-kubernetes-validations": [{"rule": rule, "message": "m"}]}, {})


def test_every_cel_rule_is_broken_by_a_bad_example() -> None:
    broken: set[str] = set()
    messages = {r.message: r.rule for rules in cel_rules().values() for r in rules}
    for path in BAD_EXAMPLES:
        for failure in cel.validate(openapi_schema(), _load(path)):
            broken |= {rule for message, rule in messages.items() if message in failure}
    assert sorted(set(messages.values()) - broken) == []


def test_lists_and_maps_that_rules_iterate_are_bounded_for_the_cost_budget() -> None:
    for path, node in _nodes(openapi_schema()["properties"]["spec"]):
        if node.get("type") == "array":
            assert "maxItems" in node, f"spec{path} needs maxItems"
    template = openapi_schema()["properties"]["spec"]["properties"]["worker"]["properties"][
        "podTemplate"]  # fmt: skip
    assert "maxProperties" in template["properties"]["metadata"]["properties"]["labels"]


def test_spec_defaults_are_in_the_crd() -> None:
    spec = openapi_schema()["properties"]["spec"]["properties"]
    assert spec["scaling"]["properties"]["minReplicas"]["default"] == 1
    assert spec["worker"]["properties"]["leaseSeconds"]["default"] == 45
    # A section's default is written filled in: the API server runs a section's CEL rules on
    # the default as written, before the defaults of its fields are applied.
    fields = spec["scaling"]["properties"]
    filled = {name: node["default"] for name, node in fields.items() if "default" in node}
    assert spec["scaling"]["default"] == filled
    assert filled["minReplicas"] == 1
    assert "default" not in spec["worker"]["properties"]["resources"]  # the model's applies


def test_crd_passes_kubernetes_validate_strict() -> None:
    tool = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert tool, "kubernetes-validate is not installed in the environment"
    result = subprocess.run([tool, "--strict", str(CRD_FILE)], capture_output=True, text=True,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout


def test_there_are_good_and_bad_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"pool-minimal.yaml", "pool-full.yaml"}
    assert len(BAD_EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_the_crd_schema_and_its_cel_rules(path: Path) -> None:
    example = _load(path)
    assert example["apiVersion"] == "leasebox.dev/v1alpha1"
    assert example["kind"] == "OutboxWorkerPool"
    assert [e.message for e in _validator().iter_errors(example)] == []
    assert cel.validate(openapi_schema(), example) == []
    parse_pool(example)


@pytest.mark.parametrize("path", BAD_EXAMPLES, ids=lambda p: p.name)
def test_bad_example_is_rejected_by_the_crd_and_by_the_operator(path: Path) -> None:
    example = _load(path)
    schema_errors = [e.message for e in _validator().iter_errors(example)]
    cel_failures = cel.validate(openapi_schema(), example) if not schema_errors else []
    assert schema_errors or cel_failures, "the API server would accept it"
    with pytest.raises((ValidationError, InvalidSpec)):
        parse_pool(example)
    uses_cel = "CEL rule" in path.read_text(encoding="utf-8")
    # Field-level problems are the schema's to catch; cross-field ones are CEL's.
    assert bool(cel_failures) == uses_cel, schema_errors or cel_failures


def test_the_keda_example_targets_an_external_pool_through_its_scale_subresource() -> None:
    documents = list(
        yaml.safe_load_all((ROOT / "examples" / "keda" / "scaledobject.yaml").read_text())
    )
    scaled = next(d for d in documents if d["kind"] == "ScaledObject")
    pool = _load(ROOT / "examples" / "pool-external.yaml")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        pool["apiVersion"], pool["kind"], pool["metadata"]["name"])  # fmt: skip
    assert pool["spec"]["scaling"]["mode"] == "External"
    (version,) = custom_resource_definition()["spec"]["versions"]
    assert "scale" in version["subresources"]
    query = next(t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus")
    assert 'state="ready"' in query["metadata"]["query"]
