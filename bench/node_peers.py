"""The Node.js peers (pg-boss, graphile-worker): installed on first use, found or skipped.

Their packages are pinned in `bench/node/package.json` and its lockfile and installed into
`bench/node/node_modules` (not committed) with the machine's node and npm. A machine
without them still runs every other benchmark; the report says the peers were skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parent / "node"
PACKAGES = ("pg-boss", "graphile-worker")


def node_binary() -> str | None:
    return shutil.which("node")


def installed_version(package: str) -> str | None:
    manifest = NODE_DIR / "node_modules" / package / "package.json"
    if not manifest.exists():
        return None
    return str(json.loads(manifest.read_text("utf-8"))["version"])


def ensure_installed() -> str | None:
    """Install the pinned packages if missing; None when ready, else why they are not."""
    if node_binary() is None:
        return "node is not installed"
    if all(installed_version(p) for p in PACKAGES):
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed"
    lockfile = (NODE_DIR / "package-lock.json").exists()
    command = [npm, "ci" if lockfile else "install", "--no-audit", "--no-fund", "--silent"]
    result = subprocess.run(
        command, cwd=NODE_DIR, capture_output=True, text=True, check=False, timeout=600
    )
    if result.returncode != 0:
        last = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:]
        return f"npm failed: {last[0] if last else result.returncode}"
    return None


def node_version() -> str | None:
    node = node_binary()
    if node is None:
        return None
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None


def script(name: str) -> Path:
    return NODE_DIR / name
