"""The chart's `leasebox web`: off by default; when on, a Deployment and a Service that the
real Helm renders, the API's schema accepts, and whose command line `leasebox web` parses,
with its DSN and tokens from Secrets and never on the command line."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from support.chart import CHART, KUBERNETES_VERSIONS, NAMESPACE, RELEASE, of_kind, render

WEB = f"{RELEASE}-web"


def web_values(**web: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "enabled": True,
        "database": {"secretRef": {"name": "outbox-db"}},
        "auth": {"mode": "token", "tokenSecret": {"name": "web-tokens"}},
    }
    values.update(web)
    return {"web": values}


def _named(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == WEB]
    return found


def test_the_web_app_is_off_by_default() -> None:
    assert not [o for o in render() if o["metadata"]["name"] == WEB]


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_the_web_deployment_and_service_pass_strict_validation(kubernetes_version: str) -> None:
    objects = render(web_values())
    for kind in ("Deployment", "Service"):
        kubernetes_validate.validate(_named(objects, kind), kubernetes_version, strict=True)
    service = _named(objects, "Service")
    deployment = _named(objects, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_web_command_line_is_one_leasebox_web_accepts_with_secrets_by_reference() -> None:
    from leasebox.cli.main import build_parser

    objects = render(web_values(allowActions=True, sla=["60s", "otp=10s"]))
    spec = _named(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.auth, args.host, args.allow_actions) == (
        "web",
        "token",
        "0.0.0.0",
        True,
    )
    assert args.sla == ["60s", "otp=10s"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env["LEASEBOX_DSN"] == {"name": "outbox-db", "key": "dsn"}
    assert env["LEASEBOX_WEB_TOKEN"]["name"] == "web-tokens"
    assert env["LEASEBOX_WEB_OPERATOR_TOKEN"]["key"] == "operator-token"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_proxy_mode_passes_the_headers_and_the_operator_groups() -> None:
    objects = render(
        web_values(auth={"mode": "proxy", "operatorGroups": ["oncall", "sre"]}, replicas=2)
    )
    deployment = _named(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--auth=proxy" in container["args"]
    assert "--operator-group=oncall" in container["args"]
    assert "--operator-group=sre" in container["args"]
    assert "--allow-actions" not in container["args"]  # read-only by default
    assert not any(e["name"].startswith("LEASEBOX_WEB_") for e in container["env"])
    assert deployment["spec"]["replicas"] == 2


def test_the_web_app_without_its_database_secret_is_refused_by_name() -> None:
    values = web_values()
    values["web"]["database"] = {"secretRef": {"name": ""}}
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert "web.database.secretRef.name" in str(caught.value)


def test_auth_mode_none_is_refused_by_the_values_schema() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.render(web_values(auth={"mode": "none"}), name=RELEASE, namespace=NAMESPACE)
    assert "mode" in str(caught.value)
