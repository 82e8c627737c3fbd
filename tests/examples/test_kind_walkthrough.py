"""The real-cluster walkthrough (docs/kubernetes.md), run as written on a kind cluster.

Opt-in: it needs `kind`, a Docker engine, `kubectl` and `helm`, and it builds the image, so
it takes minutes. It runs when those exist (or `pytest -m kind` selects it) and is skipped
with a message naming what is missing otherwise; it does not run in this project's CI,
which has no Docker engine. Every `sh` block of the walkthrough runs in order with bash
(`set -euo pipefail`), then the pool is checked with kubectl; the cluster is deleted at the
end whatever happened.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kind, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "docs" / "kubernetes.md"
CLUSTER = "leasebox"


def _missing() -> str | None:
    for tool in ("kind", "docker", "kubectl", "helm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return "no Docker engine answers (docker info failed)"
    return None


def blocks() -> list[str]:
    """The walkthrough's shell blocks, in order."""
    return re.findall(r"^```sh\n(.*?)^```", WALKTHROUGH.read_text(), flags=re.S | re.M)


def test_the_walkthrough_has_setup_pool_burst_and_cleanup_blocks() -> None:
    steps = blocks()
    assert "kind create cluster" in steps[0]
    assert any("helm install" in step for step in steps)
    assert any("kind: OutboxWorkerPool" in step for step in steps)
    assert "kind delete cluster" in steps[-1]


def test_the_walkthrough_runs_on_a_kind_cluster() -> None:
    reason = _missing()
    if reason is not None:
        pytest.skip(f"the kind walkthrough needs kind, Docker, kubectl and helm: {reason}")
    *steps, cleanup = blocks()
    try:
        for step in steps:
            command = ["bash", "-euo", "pipefail", "-c", step]
            result = subprocess.run(
                command, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
            )
            assert result.returncode == 0, f"{step}\n{result.stdout}\n{result.stderr}"
        pool = json.loads(subprocess.run(
            ["kubectl", "-n", "mail", "get", "owp", "otp", "-o", "json"],
            capture_output=True, text=True, check=True).stdout)  # fmt: skip
        ready = next(c for c in pool["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", ready
        assert pool["status"]["backlog"]["pending"] == 0
        assert pool["status"].get("lastScaleReason", "").startswith("scale")
    finally:
        subprocess.run(["bash", "-c", cleanup], cwd=ROOT, capture_output=True, check=False)
