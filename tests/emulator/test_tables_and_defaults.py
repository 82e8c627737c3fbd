"""The emulated API's Table format and CRD defaulting, each on its own.

kubectl asks for `meta.k8s.io/v1` Tables and prints the columns it gets; the API server
fills a custom resource's schema defaults before it stores it. Both are checked here over
HTTP, and the JSONPath subset the printer columns use is checked directly.
"""

from __future__ import annotations

import datetime
from typing import Any

import aiohttp

from support.kube.emulator import KubeEmulator
from support.kube.tables import find, human_age

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
GADGETS = "/apis/example.com/v1/namespaces/default/gadgets"
GADGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "additionalPrinterColumns": [
                {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                {"name": "Ready", "type": "string",
                 "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
                {"name": "Tags", "type": "string", "jsonPath": ".spec.tags", "priority": 1},
            ],
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "default": {}, "properties": {
                    "size": {"type": "integer", "default": 3},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "nested": {"type": "object", "default": {}, "properties": {
                        "mode": {"type": "string", "default": "auto"}}},
                }},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }}},
        }],
    },
}  # fmt: skip


async def test_a_custom_resource_gets_its_schema_defaults_on_create(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.apply_crd(GADGET_CRD)
    async with http.post(GADGETS, json={"metadata": {"name": "g"}}) as response:
        assert response.status == 201
        created = await response.json()
    assert created["spec"] == {"size": 3, "nested": {"mode": "auto"}}


async def test_lists_and_objects_come_as_tables_with_the_printer_columns(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.apply_crd(GADGET_CRD)
    kube_emulator.create("example.com/v1", "gadgets", {"metadata": {"name": "g"},
                         "spec": {"size": 7, "tags": ["a", "b"]}}, "default")  # fmt: skip
    kube_emulator.patch("example.com/v1", "gadgets", "g", {"status": {"conditions": [
        {"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]}},
        "default", subresource="status")  # fmt: skip
    async with http.get(GADGETS, headers={"Accept": TABLE}) as response:
        table = await response.json()
    assert table["kind"] == "Table"
    columns = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [("Name", 0), ("Size", 0), ("Ready", 0), ("Tags", 1)]
    (row,) = table["rows"]
    assert row["cells"] == ["g", 7, "True", '["a","b"]']
    assert row["object"]["kind"] == "PartialObjectMetadata"
    async with http.get(f"{GADGETS}/g", headers={"Accept": TABLE}) as response:
        assert (await response.json())["rows"][0]["cells"][0] == "g"


async def test_a_built_in_resource_has_name_and_age_columns(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.create("v1", "configmaps", {"metadata": {"name": "c"}}, "default")
    async with http.get("/api/v1/namespaces/default/configmaps", headers={"Accept": TABLE}) as r:
        table = await r.json()
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age"]
    assert table["rows"][0]["cells"][1].endswith("s")


def test_the_printer_column_jsonpath_subset_selects_as_kubectl_does() -> None:
    obj = {"spec": {"kinds": ["otp", "invite"]}, "status": {"conditions": [
        {"type": "Ready", "message": "fine"}, {"type": "Paused", "message": "no"}]}}  # fmt: skip
    assert find(obj, ".spec.kinds") == [["otp", "invite"]]
    assert find(obj, ".spec.kinds[*]") == ["otp", "invite"]
    assert find(obj, ".spec.kinds[1]") == ["invite"]
    assert find(obj, '.status.conditions[?(@.type=="Paused")].message') == ["no"]
    assert find(obj, ".status.missing") == []


def test_ages_read_like_kubectls() -> None:
    now = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)

    def age(seconds: int) -> str:
        moment = now - datetime.timedelta(seconds=seconds)
        return human_age(moment.strftime("%Y-%m-%dT%H:%M:%SZ"), now)

    assert [age(s) for s in (5, 119, 330, 1800, 7 * 3600, 5 * 86400)] == [
        "5s", "119s", "5m30s", "30m", "7h", "5d"]  # fmt: skip
