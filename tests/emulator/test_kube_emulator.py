"""The emulated API server behaves like Kubernetes where kopf and clients depend on it.

Each test covers one gap of plain kmock that the emulator fills; a tiny kopf operator runs
against it end to end in `test_kopf_on_kube_emulator`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import kmock
import pytest

from support.kube.emulator import KubeEmulator

Body = dict[str, Any]
CM = "/api/v1/namespaces/default/configmaps"
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

WIDGET_CRD: Body = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wg"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.size",
                        "statusReplicasPath": ".status.size",
                    },
                },
            }
        ],
    },
}


async def call(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Body]:
    data = None if body is None else json.dumps(body)
    headers = {"Content-Type": content_type}
    async with http.request(method, path, data=data, headers=headers) as response:
        return response.status, await response.json()


async def read_events(response: aiohttp.ClientResponse, count: int) -> list[Body]:
    events: list[Body] = []
    async with asyncio.timeout(5):
        while len(events) < count:
            line = await response.content.readline()
            if line.strip():
                events.append(json.loads(line))
    return events


def summary(events: list[Body]) -> list[tuple[str, str]]:
    return [(event["type"], event["object"]["metadata"].get("name", "")) for event in events]


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll a condition that a concurrent actor (a thread, a timer) makes true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not become true in time")
        time.sleep(0.02)


async def test_created_objects_get_server_owned_metadata(http: aiohttp.ClientSession) -> None:
    status, first = await call(http, "POST", CM, {"metadata": {"name": "a"}, "data": {}})
    _, second = await call(http, "POST", CM, {"metadata": {"name": "b"}})
    assert status == 201
    meta = first["metadata"]
    assert uuid.UUID(meta["uid"])
    assert meta["uid"] != second["metadata"]["uid"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1
    assert meta["namespace"] == "default"
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert (first["apiVersion"], first["kind"]) == ("v1", "ConfigMap")


async def test_generation_bumps_on_spec_changes_only(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.apply_crd(WIDGET_CRD)
    await call(http, "POST", WIDGETS, {"metadata": {"name": "w"}, "spec": {"size": 1}})
    _, labelled = await call(
        http, "PATCH", f"{WIDGETS}/w", {"metadata": {"labels": {"a": "b"}}}, MERGE
    )
    _, statused = await call(http, "PATCH", f"{WIDGETS}/w/status", {"status": {"ok": True}}, MERGE)
    _, specced = await call(http, "PATCH", f"{WIDGETS}/w", {"spec": {"size": 2}}, MERGE)
    assert labelled["metadata"]["generation"] == 1
    assert statused["metadata"]["generation"] == 1
    assert specced["metadata"]["generation"] == 2
    versions = [int(o["metadata"]["resourceVersion"]) for o in (labelled, statused, specced)]
    assert versions == sorted(set(versions))


async def test_generate_name_appends_a_random_suffix(http: aiohttp.ClientSession) -> None:
    body = {"metadata": {"generateName": "job-"}}
    names = {(await call(http, "POST", CM, body))[1]["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3
    assert all(re.fullmatch(r"job-[a-z0-9]{5}", name) for name in names)


async def test_creating_an_existing_name_is_a_conflict(http: aiohttp.ClientSession) -> None:
    await call(http, "POST", CM, {"metadata": {"name": "a"}})
    status, error = await call(http, "POST", CM, {"metadata": {"name": "a"}})
    assert (status, error["kind"], error["reason"]) == (409, "Status", "AlreadyExists")


async def test_missing_objects_and_unserved_resources_are_not_found(
    http: aiohttp.ClientSession,
) -> None:
    assert (await call(http, "GET", f"{CM}/nope"))[0] == 404
    assert (await call(http, "PATCH", f"{CM}/nope", {"data": {}}, MERGE))[0] == 404
    assert (await call(http, "DELETE", f"{CM}/nope"))[0] == 404
    assert (await call(http, "GET", WIDGETS))[0] == 404
    ghost = "/api/v1/namespaces/ghost/configmaps"
    assert (await call(http, "POST", ghost, {"metadata": {"name": "a"}}))[0] == 404
    await call(http, "POST", CM, {"metadata": {"name": "a"}})
    assert (await call(http, "GET", f"{CM}/a/scale"))[0] == 404


async def test_a_failed_json_patch_test_is_unprocessable(http: aiohttp.ClientSession) -> None:
    _, obj = await call(http, "POST", CM, {"metadata": {"name": "a"}, "data": {"k": "1"}})
    current = obj["metadata"]["resourceVersion"]
    ops = [{"op": "replace", "path": "/data/k", "value": "2"}]
    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}, *ops]
    fresh = [{"op": "test", "path": "/metadata/resourceVersion", "value": current}, *ops]
    status, error = await call(http, "PATCH", f"{CM}/a", stale, JSON_PATCH)
    assert (status, error["reason"]) == (422, "Invalid")
    assert (await call(http, "GET", f"{CM}/a"))[1]["data"] == {"k": "1"}
    status, patched = await call(http, "PATCH", f"{CM}/a", fresh, JSON_PATCH)
    assert (status, patched["data"]) == (200, {"k": "2"})


async def test_merge_patches_merge_dicts_replace_lists_and_drop_nulls(
    http: aiohttp.ClientSession,
) -> None:
    body = {
        "metadata": {"name": "a", "labels": {"x": "1", "y": "2"}},
        "data": {"k": "v"},
        "list": [1, 2],
    }
    await call(http, "POST", CM, body)
    patch = {"metadata": {"labels": {"x": None, "z": "3"}}, "list": [3]}
    _, merged = await call(http, "PATCH", f"{CM}/a", patch, MERGE)
    strategic = "application/strategic-merge-patch+json"
    _, again = await call(http, "PATCH", f"{CM}/a", {"data": {"k2": "v2"}}, strategic)
    assert merged["metadata"]["labels"] == {"y": "2", "z": "3"}
    assert (merged["list"], merged["data"]) == ([3], {"k": "v"})
    assert again["data"] == {"k": "v", "k2": "v2"}


async def test_put_replaces_the_object_unless_its_version_is_stale(
    http: aiohttp.ClientSession,
) -> None:
    _, obj = await call(http, "POST", CM, {"metadata": {"name": "a"}, "data": {"k": "v"}})
    replacement = {"metadata": {"name": "a", "resourceVersion": "1"}, "data": {"n": "1"}}
    status, error = await call(http, "PUT", f"{CM}/a", replacement)
    assert (status, error["reason"]) == (409, "Conflict")
    replacement["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    status, replaced = await call(http, "PUT", f"{CM}/a", replacement)
    assert (status, replaced["data"]) == (200, {"n": "1"})
    assert replaced["metadata"]["uid"] == obj["metadata"]["uid"]


async def test_status_subresource_writes_touch_only_the_status(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.apply_crd(WIDGET_CRD)
    body = {"metadata": {"name": "w"}, "spec": {"size": 1}, "status": {"size": 9}}
    _, created = await call(http, "POST", WIDGETS, body)
    _, main = await call(http, "PATCH", f"{WIDGETS}/w", {"status": {"size": 5}}, MERGE)
    patch = {"spec": {"size": 7}, "status": {"size": 1}}
    _, status_patched = await call(http, "PATCH", f"{WIDGETS}/w/status", patch, MERGE)
    put_body = {**status_patched, "spec": {"size": 8}, "status": {"size": 2}}
    _, status_put = await call(http, "PUT", f"{WIDGETS}/w/status", put_body)
    assert "status" not in created
    assert "status" not in main
    assert (status_patched["spec"], status_patched["status"]) == ({"size": 1}, {"size": 1})
    assert (status_put["spec"], status_put["status"]) == ({"size": 1}, {"size": 2})
    assert status_put["metadata"]["generation"] == 1


async def test_scale_subresource_reads_and_writes_replicas(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.apply_crd(WIDGET_CRD)
    await call(http, "POST", WIDGETS, {"metadata": {"name": "w"}, "spec": {"size": 2}})
    deployments = "/apis/apps/v1/namespaces/default/deployments"
    selector = {"matchLabels": {"app": "x"}}
    await call(
        http,
        "POST",
        deployments,
        {"metadata": {"name": "d"}, "spec": {"replicas": 1, "selector": selector}},
    )
    _, scale = await call(http, "GET", f"{deployments}/d/scale")
    _, scaled = await call(
        http, "PATCH", f"{deployments}/d/scale", {"spec": {"replicas": 4}}, MERGE
    )
    _, widget_scale = await call(
        http, "PATCH", f"{WIDGETS}/w/scale", {"spec": {"replicas": 3}}, MERGE
    )
    assert (scale["kind"], scale["spec"], scale["status"]) == (
        "Scale",
        {"replicas": 1},
        {"replicas": 1, "selector": "app=x"},
    )
    assert scaled["spec"] == {"replicas": 4}
    deployment = kube_emulator.get("apps/v1", "deployments", "d", "default")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 4
    assert deployment["metadata"]["generation"] == 2
    widget = kube_emulator.get("example.com/v1", "widgets", "w", "default")
    assert widget is not None
    assert widget["spec"] == {"size": 3}
    assert widget_scale["spec"] == {"replicas": 3}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", {"a", "b"}),
        ("app==web,tier!=db", {"a"}),
        ("tier in (db, cache)", {"b", "c"}),
        ("tier notin (db)", {"a", "c"}),
        ("tier", {"b", "c"}),
        ("!tier", {"a"}),
    ],
)
async def test_label_selectors_filter_lists(
    http: aiohttp.ClientSession, selector: str, expected: set[str]
) -> None:
    labels = {"a": {"app": "web"}, "b": {"app": "web", "tier": "db"}, "c": {"tier": "cache"}}
    for name, labelled in labels.items():
        await call(http, "POST", CM, {"metadata": {"name": name, "labels": labelled}})
    async with http.get(CM, params={"labelSelector": selector}) as response:
        listed = await response.json()
    assert {item["metadata"]["name"] for item in listed["items"]} == expected


async def test_bad_selectors_are_rejected_and_field_selectors_filter(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.create("v1", "namespaces", {"metadata": {"name": "other"}})
    for namespace in ("default", "other"):
        kube_emulator.create("v1", "configmaps", {"metadata": {"name": "a"}}, namespace)
    kube_emulator.create("v1", "configmaps", {"metadata": {"name": "b"}}, "default")
    async with http.get("/api/v1/configmaps", params={"fieldSelector": "metadata.name=a"}) as rsp:
        by_name = await rsp.json()
    params = {"fieldSelector": "metadata.namespace!=other,metadata.name==a"}
    async with http.get("/api/v1/configmaps", params=params) as rsp:
        by_namespace = await rsp.json()
    async with http.get(CM, params={"labelSelector": "a in b"}) as rsp:
        assert rsp.status == 400
    assert sorted(i["metadata"]["namespace"] for i in by_name["items"]) == ["default", "other"]
    assert [i["metadata"]["namespace"] for i in by_namespace["items"]] == ["default"]


async def test_watch_from_a_resource_version_streams_only_later_events(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.create("v1", "configmaps", {"metadata": {"name": "old"}}, "default")
    since = kube_emulator.create("v1", "configmaps", {"metadata": {"name": "a"}}, "default")
    kube_emulator.patch("v1", "configmaps", "a", {"data": {"k": "v"}}, "default")
    kube_emulator.create("v1", "configmaps", {"metadata": {"name": "b"}}, "default")
    params = {"watch": "true", "resourceVersion": since["metadata"]["resourceVersion"]}
    async with http.get(CM, params=params) as response:
        replayed = await read_events(response, 2)
        kube_emulator.delete("v1", "configmaps", "b", "default")
        live = await read_events(response, 1)
    assert summary(replayed) == [("MODIFIED", "a"), ("ADDED", "b")]
    assert summary(live) == [("DELETED", "b")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in replayed + live]
    assert versions == sorted(versions)
    assert versions[0] > int(since["metadata"]["resourceVersion"])


async def test_watch_without_a_version_lists_first_and_can_end_with_a_bookmark(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.create("v1", "configmaps", {"metadata": {"name": "a"}}, "default")
    params = {"watch": "true", "sendInitialEvents": "true", "allowWatchBookmarks": "true"}
    async with http.get(CM, params=params) as response:
        initial = await read_events(response, 2)
    params = {"watch": "true", "timeoutSeconds": "1"}
    async with http.get(CM, params=params) as response, asyncio.timeout(5):
        ended = [json.loads(line) for line in (await response.read()).splitlines() if line]
    assert summary(initial) == [("ADDED", "a"), ("BOOKMARK", "")]
    assert initial[1]["object"]["kind"] == "ConfigMap"
    annotations = initial[1]["object"]["metadata"]["annotations"]
    assert annotations == {"k8s.io/initial-events-end": "true"}
    assert summary(ended) == [("ADDED", "a")]


async def test_watch_reports_objects_entering_and_leaving_a_selector(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.create("v1", "configmaps", {"metadata": {"name": "a"}}, "default")
    params = {"watch": "true", "labelSelector": "app=web"}
    async with http.get(CM, params=params) as response:
        for labels in ({"app": "web"}, {"app": "web", "x": "1"}, {"app": None}):
            kube_emulator.patch(
                "v1", "configmaps", "a", {"metadata": {"labels": labels}}, "default"
            )
        events = await read_events(response, 3)
    assert summary(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


async def test_namespaces_can_be_listed_fetched_and_created(http: aiohttp.ClientSession) -> None:
    status, created = await call(http, "POST", "/api/v1/namespaces", {"metadata": {"name": "x"}})
    _, listed = await call(http, "GET", "/api/v1/namespaces")
    _, fetched = await call(http, "GET", "/api/v1/namespaces/x")
    assert status == 201
    assert created["status"] == {"phase": "Active"}
    assert {item["metadata"]["name"] for item in listed["items"]} == {"default", "x"}
    assert (fetched["kind"], fetched["metadata"]["name"]) == ("Namespace", "x")
    assert "namespace" not in fetched["metadata"]


async def test_discovery_answers_with_and_without_trailing_slashes(
    http: aiohttp.ClientSession,
) -> None:
    bodies = {
        path: (await call(http, "GET", path))[1]
        for path in (
            "/version",
            "/version/",
            "/api",
            "/api/",
            "/apis",
            "/apis/",
            "/api/v1",
            "/apis/apps/v1",
        )
    }
    assert bodies["/version/"] == bodies["/version"]
    assert bodies["/version"]["major"] == "1"
    assert bodies["/api/"] == bodies["/api"] == {"kind": "APIVersions", "versions": ["v1"]}
    groups = {group["name"] for group in bodies["/apis/"]["groups"]}
    assert groups == {group["name"] for group in bodies["/apis"]["groups"]}
    assert groups == {
        "apps",
        "policy",
        "events.k8s.io",
        "apiextensions.k8s.io",
        "coordination.k8s.io",
        "kopf.dev",
    }
    core = {r["name"]: r for r in bodies["/api/v1"]["resources"]}
    assert bodies["/api/v1"]["groupVersion"] == "v1"
    assert set(core) >= {"namespaces", "secrets", "events", "configmaps", "pods"}
    assert core["namespaces"]["namespaced"] is False
    assert core["pods"]["namespaced"] is True
    apps = {r["name"]: r["kind"] for r in bodies["/apis/apps/v1"]["resources"]}
    assert apps == {
        "deployments": "Deployment",
        "deployments/status": "Deployment",
        "deployments/scale": "Deployment",
    }


async def test_creating_a_crd_serves_its_resource_until_it_is_deleted(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    status, crd = await call(http, "POST", crds, WIDGET_CRD)
    _, discovered = await call(http, "GET", "/apis/example.com/v1")
    created_status, widget = await call(http, "POST", WIDGETS, {"metadata": {"name": "w"}})
    await call(http, "DELETE", f"{crds}/widgets.example.com")
    assert status == 201
    assert crd["status"]["acceptedNames"]["kind"] == "Widget"
    resources = {r["name"]: r for r in discovered["resources"]}
    assert set(resources) == {"widgets", "widgets/status", "widgets/scale"}
    assert (resources["widgets"]["kind"], resources["widgets"]["namespaced"]) == ("Widget", True)
    assert resources["widgets"]["shortNames"] == ["wg"]
    assert (created_status, widget["apiVersion"], widget["kind"]) == (
        201,
        "example.com/v1",
        "Widget",
    )
    assert (await call(http, "GET", WIDGETS))[0] == 404
    assert (await call(http, "GET", "/apis/example.com/v1"))[0] == 404


def test_deleting_an_owner_collects_its_dependents(kube_emulator: KubeEmulator) -> None:
    def owned(name: str, owner: Body) -> Body:
        meta = owner["metadata"]
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": meta["name"], "uid": meta["uid"]}
        body = {"metadata": {"name": name, "ownerReferences": [ref]}}
        return kube_emulator.create("v1", "configmaps", body, "default")

    owner = kube_emulator.create("v1", "configmaps", {"metadata": {"name": "owner"}}, "default")
    grandchild = owned("grandchild", owned("child", owner))
    stranger = kube_emulator.create(
        "v1", "configmaps", {"metadata": {"name": "stranger"}}, "default"
    )
    owned("orphan", stranger)
    kube_emulator.delete("v1", "configmaps", "owner", "default")
    kube_emulator.api.delete_object(
        kmock.resource("v1/configmaps"), "default", "stranger", orphan=True
    )
    names = {obj["metadata"]["name"] for obj in kube_emulator.list("v1", "configmaps")}
    assert names == {"orphan"}
    assert grandchild["metadata"]["name"] not in names


async def test_finalizers_hold_a_deleted_object_until_they_are_removed(
    http: aiohttp.ClientSession,
) -> None:
    await call(http, "POST", CM, {"metadata": {"name": "a", "finalizers": ["x/y"]}})
    status, deleting = await call(http, "DELETE", f"{CM}/a")
    _, still_there = await call(http, "GET", f"{CM}/a")
    more = {"metadata": {"finalizers": ["x/y", "x/z"]}}
    refused, _ = await call(http, "PATCH", f"{CM}/a", more, MERGE)
    _, released = await call(http, "PATCH", f"{CM}/a", {"metadata": {"finalizers": None}}, MERGE)
    assert status == 200
    assert deleting["metadata"]["deletionTimestamp"]
    assert still_there["metadata"]["deletionTimestamp"] == deleting["metadata"]["deletionTimestamp"]
    assert refused == 422
    assert "finalizers" not in released["metadata"]
    assert (await call(http, "GET", f"{CM}/a"))[0] == 404


def test_deployment_status_follows_replicas_immediately_by_default(
    kube_emulator: KubeEmulator,
) -> None:
    body = {"metadata": {"name": "d"}, "spec": {"replicas": 3}}
    kube_emulator.create("apps/v1", "deployments", body, "default")
    first = kube_emulator.get("apps/v1", "deployments", "d", "default")
    kube_emulator.patch("apps/v1", "deployments", "d", {"spec": {"replicas": 0}}, "default")
    scaled_down = kube_emulator.get("apps/v1", "deployments", "d", "default")
    assert first is not None
    assert scaled_down is not None
    assert first["status"] == {
        "replicas": 3,
        "updatedReplicas": 3,
        "readyReplicas": 3,
        "availableReplicas": 3,
        "observedGeneration": 1,
    }
    assert scaled_down["status"] == {"observedGeneration": 2}


def test_deployment_readiness_follows_after_the_delay(kube_emulator: KubeEmulator) -> None:
    kube_emulator.deployment_ready_delay = 0.2
    body = {"metadata": {"name": "d"}, "spec": {"replicas": 2}}
    kube_emulator.create("apps/v1", "deployments", body, "default")
    starting = kube_emulator.get("apps/v1", "deployments", "d", "default")

    def ready() -> int:
        deployment = kube_emulator.get("apps/v1", "deployments", "d", "default") or {}
        return int(deployment.get("status", {}).get("readyReplicas", 0))

    assert starting is not None
    assert starting["status"]["replicas"] == 2
    assert "readyReplicas" not in starting["status"]
    wait_until(lambda: ready() == 2)


def test_frozen_deployments_keep_their_status_until_thawed(kube_emulator: KubeEmulator) -> None:
    body = {"metadata": {"name": "d"}, "spec": {"replicas": 1}}
    kube_emulator.create("apps/v1", "deployments", body, "default")
    kube_emulator.freeze_deployments = True
    kube_emulator.patch("apps/v1", "deployments", "d", {"spec": {"replicas": 5}}, "default")
    frozen = kube_emulator.get("apps/v1", "deployments", "d", "default")
    kube_emulator.freeze_deployments = False
    thawed = kube_emulator.get("apps/v1", "deployments", "d", "default")
    assert frozen is not None
    assert thawed is not None
    assert frozen["status"]["readyReplicas"] == 1
    assert frozen["status"]["observedGeneration"] == 1
    assert thawed["status"]["readyReplicas"] == 5
    assert thawed["status"]["observedGeneration"] == 2


async def test_events_of_both_apis_are_collected(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    core = {"metadata": {"generateName": "e-"}, "reason": "Scaled"}
    await call(http, "POST", "/api/v1/namespaces/default/events", core)
    modern = {"metadata": {"name": "m"}, "reason": "Paused"}
    await call(http, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", modern)
    assert sorted(event["reason"] for event in kube_emulator.events("default")) == [
        "Paused",
        "Scaled",
    ]
    assert kube_emulator.events("elsewhere") == []


async def test_internal_failures_are_answered_500_and_kept_for_the_fixture(
    kube_emulator: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    kube_emulator.api["get /boom"] << (lambda: 1 / 0)
    status, error = await call(http, "GET", "/boom")
    assert (status, error["reason"]) == (500, "ZeroDivisionError")
    assert [type(exc) for exc in kube_emulator.api.server_errors] == [ZeroDivisionError]
    kube_emulator.api.server_errors.clear()  # or the fixture fails this test on teardown


def test_direct_access_reports_errors_as_the_api_does(kube_emulator: KubeEmulator) -> None:
    kube_emulator.create("v1", "configmaps", {"metadata": {"name": "a"}}, "default")
    with pytest.raises(kmock.KubernetesError) as conflict:
        kube_emulator.create("v1", "configmaps", {"metadata": {"name": "a"}}, "default")
    with pytest.raises(kmock.KubernetesError) as missing:
        kube_emulator.delete("v1", "configmaps", "b", "default")
    assert (conflict.value.status, missing.value.status) == (409, 404)
    assert kube_emulator.get("v1", "configmaps", "b", "default") is None
