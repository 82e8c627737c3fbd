"""A real Prometheus server on loopback (Debian's `prometheus`), scraping given targets.

The monitoring tests evaluate every shipped alert and dashboard query through its HTTP API,
so that a misspelled metric or label fails a test rather than a dashboard.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from leasebox.testing.ports import free_port


def required_tool(name: str, package: str) -> str:
    """The path of a system program the tests need: a failure under CI, a skip elsewhere."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing: install the Debian package {package}")
        pytest.skip(f"{name} is missing (Debian package {package})")
    return found


def prometheus_binary() -> str:
    return required_tool("prometheus", "prometheus")


class Prometheus:
    """A Prometheus server on loopback with a given scrape configuration."""

    def __init__(self, workdir: Path, targets: dict[str, tuple[int, dict[str, str]]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": labels}],
                }
                for job, (port, labels) in targets.items()
            ],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.workdir = workdir

    def start(self) -> subprocess.Popen[bytes]:
        command = [
            prometheus_binary(),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with (self.workdir / "prometheus.log").open("wb") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                payload: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                payload = json.loads(body)
            except ValueError:  # "Service Unavailable" while the server is starting
                payload = {"status": f"http {exc.code}", "error": body.decode(errors="replace")}
        except urllib.error.URLError as exc:
            payload = {"status": "unreachable", "error": str(exc.reason)}
        return payload

    def has_series(self, selector: str) -> bool:
        answer = self.query(selector)
        return answer.get("status") == "success" and bool(answer["data"]["result"])

    def targets_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=2) as response:
                active = json.loads(response.read())["data"]["activeTargets"]
        except OSError:
            return False
        return bool(active) and all(t["health"] == "up" for t in active)
