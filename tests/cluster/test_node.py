"""The process node itself: a Deployment's pods run, report readiness and go away."""

from __future__ import annotations

from support.cluster.kubelet import ProcessKubelet
from support.cluster.rest import Rest
from support.pace import wait_for

SERVE = (
    "import http.server, os\n"
    "port = int(os.environ['PORT'])\n"
    "http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler)"
    ".serve_forever()\n"
)


def test_a_deployment_gets_running_ready_pods_that_a_delete_stops(
    kube: Rest, kubelet: ProcessKubelet, namespace: str
) -> None:
    labels = {"app": "serve"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "serve",
                            "image": "leasebox",
                            "command": ["python", "-c", SERVE],
                            "env": [{"name": "PORT", "value": "8000"}],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "readinessProbe": {
                                "httpGet": {"path": "/", "port": "http"},
                                "periodSeconds": 1,
                            },
                        }
                    ]
                },
            },
        },
    }
    kube.create("apps/v1", "deployments", deployment, namespace)

    def ready() -> int:
        found = kube.get("apps/v1", "deployments", "serve", namespace) or {}
        return int((found.get("status") or {}).get("readyReplicas", 0))

    assert wait_for(lambda: ready() == 2, what="two ready replicas", timeout=90)
    pods = kube.list("v1", "pods", namespace)
    assert {p["spec"]["nodeName"] for p in pods} == {"leasebox-test-node"}
    ports = {kubelet.host_port(namespace, p["metadata"]["name"], "http") for p in pods}
    assert len(ports) == 2, "each pod has a port of its own"

    kube.merge_patch("apps/v1", "deployments", "serve", {"spec": {"replicas": 0}}, namespace)
    wait_for(lambda: not kube.list("v1", "pods", namespace), what="the pods to go", timeout=90)
    assert not kubelet.runners(namespace)
