"""The CRD and the example pools as the real API server judges them.

The server compiles every CEL rule within its cost budget when it accepts the CRD, checks
that the schema is structural, applies the defaults, prunes unknown fields (or, with strict
field validation, refuses them) and runs the rules on every write. Each good example must
be accepted; each bad example of the operator's own validation tests must be refused, with
the rule's message where a CEL rule refuses it, and the operator's own checks must refuse
it too: the server and the operator agree case by case.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from leasebox_operator.errors import InvalidSpec
from leasebox_operator.models import cel_rules
from leasebox_operator.reconcile import parse_pool
from support.cluster.controlplane import ROOT, ControlPlane
from support.cluster.rest import Rest

CRD_FILE = ROOT / "crds" / "outboxworkerpools.leasebox.dev.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("pool-*.yaml"))
BAD_EXAMPLES = sorted((ROOT / "tests" / "operator" / "bad-examples").glob("*.yaml"))
MESSAGES = sorted({rule.message for rules in cel_rules().values() for rule in rules})


def _dry_run(plane: ControlPlane, path: Path) -> tuple[int, str]:
    done = plane.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
        "--force-conflicts",
        "-f",
        str(path),
        check=False,
    )
    return done.returncode, done.stderr + done.stdout


def test_the_crd_is_accepted_and_served_with_its_printer_columns_and_subresources(
    release: str, control_plane: ControlPlane
) -> None:
    del release
    code, output = _dry_run(control_plane, CRD_FILE)
    assert code == 0, output
    served = control_plane.kubectl("get", "crd", "outboxworkerpools.leasebox.dev", "-o", "yaml")
    crd = yaml.safe_load(served.stdout)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    assert established["NamesAccepted"] == "True"
    (version,) = crd["spec"]["versions"]
    assert set(version["subresources"]) == {"status", "scale"}
    resources = control_plane.kubectl("api-resources", "--api-group=leasebox.dev").stdout
    assert "owp" in resources
    assert "OutboxWorkerPool" in resources


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_pool_is_accepted_by_the_server(
    release: str, control_plane: ControlPlane, kube: Rest, path: Path
) -> None:
    del release
    namespace = yaml.safe_load(path.read_text(encoding="utf-8"))["metadata"].get("namespace")
    if namespace and kube.get("v1", "namespaces", namespace) is None:
        kube.create(
            "v1",
            "namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    code, output = _dry_run(control_plane, path)
    assert code == 0, output


@pytest.mark.parametrize("path", BAD_EXAMPLES, ids=lambda p: p.name)
def test_every_bad_example_is_refused_by_the_server_and_by_the_operator(
    release: str, control_plane: ControlPlane, path: Path
) -> None:
    del release
    code, output = _dry_run(control_plane, path)
    assert code != 0, f"the server accepted {path.name}"
    refused_by_rule = [m for m in MESSAGES if m in output]
    if "(a CEL rule)" in path.read_text(encoding="utf-8"):
        assert refused_by_rule, f"no CEL rule's message in the server's answer: {output}"
    else:
        assert not refused_by_rule, output
    with pytest.raises((ValidationError, InvalidSpec)):
        parse_pool(yaml.safe_load(path.read_text(encoding="utf-8")))
