"""`make mutate`: the guarantees' mutation gate, over a curated list of one-line mutations.

Each mutation in `mutations.toml` names a file, a snippet of it, what the snippet becomes,
and the tests expected to kill it. The runner copies the project into a scratch directory
once (the work tree is never touched), applies one mutation at a time there, runs the
named tests with the project's own virtualenv, and restores the file. A mutation counts as
killed only when a test fails on an assertion: a test that fails by timing out (a
`TimeoutError`, or the per-mutation deadline) has not shown the guarantee, so it counts as
survived. The gate fails when any mutation survives, and prints which test killed each.

    python -m tools.mutate                 every mutation
    python -m tools.mutate --only ID ...   some of them
    python -m tools.mutate --list          the list, without running
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = Path(__file__).resolve().parent / "mutations.toml"
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", "node_modules"
)
DEFAULT_DEADLINE = 600.0
# A failure raised as one of these waited for something: not an assertion.
_TIMEOUT_ERRORS = ("TimeoutError", "asyncio.exceptions.TimeoutError", "CancelledError")
# What the suite's condition waits say when they give up (`support.waiting.wait_for`, the
# rigs' `wait_until`): a kill by one of them is a timeout too.
_TIMEOUT_PHRASES = ("timed out", "not in time", "in time:", "not met within")


@dataclass(frozen=True)
class Mutation:
    """One deliberate break of a guarantee, and the tests that must notice it."""

    id: str
    guarantee: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    after: str = ""
    deadline: float = DEFAULT_DEADLINE

    def apply(self, text: str) -> str:
        """`text` with the mutation applied; the snippet must be unambiguous."""
        start = 0
        if self.after:
            start = text.find(self.after)
            if start < 0:
                raise LookupError(f"{self.id}: anchor {self.after!r} not in {self.file}")
        at = text.find(self.find, start)
        if at < 0:
            raise LookupError(f"{self.id}: snippet not found in {self.file}: {self.find!r}")
        if not self.after and text.find(self.find, at + 1) >= 0:
            raise LookupError(f"{self.id}: snippet occurs twice in {self.file}; give `after`")
        return text[:at] + self.replace + text[at + len(self.find) :]


@dataclass(frozen=True)
class Verdict:
    mutation: Mutation
    killed: bool
    killer: str
    seconds: float
    reason: str = ""
    """The first line of the killing failure (the assertion that noticed)."""


def load(path: Path = CATALOGUE) -> list[Mutation]:
    entries = tomllib.loads(path.read_text("utf-8"))["mutation"]
    mutations = [Mutation(**{**e, "tests": tuple(e["tests"])}) for e in entries]
    ids = [m.id for m in mutations]
    if len(set(ids)) != len(ids):
        raise ValueError("mutation ids must be unique")
    return mutations


def _failures(report: Path) -> list[tuple[str, str]]:
    """(test id, first line of the failure) of every failed or errored test in a report."""
    if not report.exists():
        return []
    found = []
    # The report is pytest's own, written a moment ago into the scratch copy.
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314
        for outcome in (*case.iter("failure"), *case.iter("error")):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append((name, (outcome.get("message") or "").split("\n", 1)[0]))
    return found


def run_one(mutation: Mutation, scratch: Path, python: Path) -> Verdict:
    target = scratch / mutation.file
    original = target.read_text("utf-8")
    target.write_text(mutation.apply(original), "utf-8")
    report = scratch / "build" / f"mutation-{mutation.id}.xml"
    report.parent.mkdir(exist_ok=True)
    report.unlink(missing_ok=True)
    started = time.monotonic()
    # Worker processes the tests start import the mutated copy too, not the installed tree.
    env = {**os.environ, "PYTHONPATH": f"{scratch / 'worker'}:{scratch / 'operator'}"}
    try:
        subprocess.run(
            [
                *(str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"),
                *("--junitxml", str(report), *mutation.tests),
            ],
            cwd=scratch,
            env=env,
            capture_output=True,
            timeout=mutation.deadline,
            check=False,
        )
        failures = _failures(report)
    except subprocess.TimeoutExpired:
        failures = [("(the whole run)", "timed out")]
    finally:
        target.write_text(original, "utf-8")
    seconds = time.monotonic() - started
    for name, message in failures:
        raised = message.split(":", 1)[0].strip()
        if raised not in _TIMEOUT_ERRORS and not any(p in message for p in _TIMEOUT_PHRASES):
            return Verdict(mutation, True, name, seconds, message)
    killer = f"only by a timeout: {failures[0][0]}" if failures else "no test failed"
    return Verdict(mutation, False, killer, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make mutate", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these mutations")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--json", type=Path, help="also write the verdicts to this file")
    args = parser.parse_args(argv)
    mutations = load()
    if args.only:
        unknown = set(args.only) - {m.id for m in mutations}
        if unknown:
            parser.error(f"unknown mutation ids: {', '.join(sorted(unknown))}")
        mutations = [m for m in mutations if m.id in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.id:32} {m.guarantee}")
        return 0
    python = ROOT / ".venv" / "bin" / "python"
    for m in mutations:  # every snippet must still exist before anything runs
        m.apply((ROOT / m.file).read_text("utf-8"))
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="leasebox-mutate-") as scratch_dir:
        scratch = Path(scratch_dir) / "leasebox"
        shutil.copytree(ROOT, scratch, ignore=COPY_IGNORE)
        for m in mutations:
            verdict = run_one(m, scratch, python)
            verdicts.append(verdict)
            state = "killed  " if verdict.killed else "SURVIVED"
            print(f"{state} {m.id:32} {verdict.seconds:6.1f}s  {verdict.killer}", flush=True)
            if verdict.reason:
                print(f"         {'':32}          {verdict.reason[:110]}", flush=True)
    survived = [v for v in verdicts if not v.killed]
    total = sum(v.seconds for v in verdicts)
    print(f"\n{len(verdicts) - len(survived)} of {len(verdicts)} killed in {total:.0f}s")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "id": v.mutation.id,
                        "guarantee": v.mutation.guarantee,
                        "killed": v.killed,
                        "by": v.killer,
                        "reason": v.reason,
                        "seconds": v.seconds,
                    }
                    for v in verdicts
                ],
                indent=2,
            )
        )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
