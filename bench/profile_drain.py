"""A profile of the worker's drain: where its CPU goes, sampled, saved beside the results.

`leasebox worker --drain` (the drain benchmark's command, `null://` unless told otherwise)
empties N ready rows under py-spy, which samples the process from outside (so the worker
runs unmodified) and, with `--gil`, samples only the thread that holds the GIL: waits for
the database or the provider and idle executor threads are not counted, so the samples
add up to the process's Python CPU time (they agree with the CPU the drain benchmark
measures per message). The raw samples (collapsed stacks, one line per distinct stack) are
saved as `bench/results/profile-<name>.txt`, and a summary (`profile-<name>.md`) says where
the time goes: by package, by leasebox function (inclusive), and by leaf function (self).
Without py-spy (or where the kernel forbids tracing) it falls back to cProfile, whose
`pstats` table is summarised instead.
"""

from __future__ import annotations

import io
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.drain import settle
from bench.pgserver import BenchServer
from bench.systems import ROOT, leasebox_system, seed_outbox

RESULTS = ROOT / "bench" / "results"
SAMPLE_RATE = 250
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*)\)$")
_PACKAGE_ROOTS = ("site-packages/", "dist-packages/", "/worker/", "/operator/", "/bench/")


def module_of(path: str) -> str:
    """The dotted module of a frame's file (`leasebox.runtime.worker`, `psycopg.cursor`)."""
    cleaned = path.replace("\\", "/")
    for root in _PACKAGE_ROOTS:
        if root in cleaned:
            cleaned = cleaned.rsplit(root, 1)[1]
            break
    else:
        if "/lib/python" in cleaned:
            cleaned = cleaned.rsplit("/lib/python", 1)[1].split("/", 1)[-1]
    if cleaned == "<string>":
        return "generated"  # code made with exec: dataclass and namedtuple methods
    if cleaned.startswith("<"):
        return cleaned.strip("<>").removeprefix("frozen ")
    return cleaned.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def area_of(module: str) -> str:
    """The package a module counts under: leasebox's subpackages apart, others by top name."""
    parts = module.split(".")
    if parts[0] == "leasebox" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0] or "?"


def _frames(stack: str) -> list[tuple[str, str]]:
    found = []
    for frame in stack.split(";"):
        match = _FRAME.match(frame.strip())
        if match:
            found.append((match["function"], module_of(match["file"])))
    return found


@dataclass(frozen=True)
class Summary:
    """Where the sampled CPU went; shares are of the samples after start-up."""

    samples: int
    start_up: int
    by_package: list[tuple[str, float]]
    inclusive: list[tuple[str, float]]
    leaves: list[tuple[str, float]]


def summarise_collapsed(text: str, top: int = 15) -> Summary:
    """Collapsed stacks (`frame;frame;... count`) summarised. Stacks inside an import are
    start-up, counted apart, so that the shares describe the drain itself."""
    total = start_up = 0
    packages: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = _frames(stack)
        if not frames:
            continue
        total += count
        if any(m.startswith("importlib") for _, m in frames):
            start_up += count
            continue
        function, module = frames[-1]
        packages[area_of(module)] += count
        leaves[f"{module}.{function}"] += count
        own = {f"{m}.{f}" for f, m in frames if m.startswith("leasebox.")}
        for name in {n for n in own if not n.startswith("leasebox.cli.")}:
            inclusive[name] += count
    running = total - start_up

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        if not running:
            return []
        return [(name, 100.0 * c / running) for name, c in counter.most_common(top)]

    return Summary(total, start_up, shares(packages), shares(inclusive), shares(leaves))


@dataclass(frozen=True)
class Profile:
    """One profiled drain: the tool, where the CPU went, and the files written."""

    name: str
    rows: int
    tool: str
    summary: Summary | None
    raw_path: str
    summary_path: str
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        def share(rows: list[tuple[str, float]]) -> list[dict[str, Any]]:
            return [{"name": name, "percent": round(p, 1)} for name, p in rows]

        found = self.summary
        return {
            "name": self.name,
            "rows": self.rows,
            "tool": self.tool,
            "samples": found.samples if found else 0,
            "start_up_samples": found.start_up if found else 0,
            "by_package": share(found.by_package) if found else [],
            "leasebox_inclusive": share(found.inclusive) if found else [],
            "self": share(found.leaves) if found else [],
            "raw": self.raw_path,
            "summary": self.summary_path,
            "error": self.error,
        }


def markdown(profile: Profile) -> str:
    """The summary file: what was profiled, then the three tables."""

    def table(title: str, found: list[tuple[str, float]]) -> str:
        lines = [f"**{title}**", "", "| where | % of the drain's samples |", "|---|---:|"]
        lines += [f"| `{n}` | {p:.1f} |" for n, p in found]
        return "\n".join(lines)

    summary = profile.summary
    assert summary is not None
    head = (
        f"# Profile: `leasebox worker --drain` ({profile.name}), {profile.rows:,} rows\n\n"
        f"{profile.tool}: {summary.samples:,} samples of the thread holding the GIL (Python's "
        "CPU: waits for the database and the provider are not sampled), "
        f"{summary.start_up:,} of them in start-up (imports), left out of the shares below. "
        "`generated` is code made with exec (dataclass `__init__` and the like). "
        "Raw samples (collapsed stacks): "
        f"`{Path(profile.raw_path).name}`."
    )
    parts = [
        head,
        table("By package (where the CPU is spent, leaf frame)", summary.by_package),
        table("leasebox functions, inclusive (they and their callees)", summary.inclusive),
        table("Leaf functions, self time", summary.leaves),
    ]
    return "\n\n".join(parts) + "\n"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _py_spy() -> str | None:
    script = Path(sys.executable).parent / "py-spy"
    return str(script) if script.exists() else shutil.which("py-spy")


def _profile_with_py_spy(tool: str, command: list[str], raw: Path) -> str:
    run = [tool, "record", "--format", "raw", "--nolineno", "--gil", "-r", str(SAMPLE_RATE)]
    done = subprocess.run(
        [*run, "-o", str(raw), "--", *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        check=False,
    )
    if done.returncode != 0 or not raw.exists():
        return " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]) or "py-spy failed"
    return ""


def _profile_with_cprofile(command: list[str], out: Path) -> tuple[str, str]:
    argv = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "leasebox", *command[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=900, check=False)
    if done.returncode != 0:
        return "", " | ".join(done.stderr.strip().splitlines()[-3:])
    buffer = io.StringIO()
    pstats.Stats(str(out), stream=buffer).sort_stats("tottime").print_stats(25)
    return buffer.getvalue(), ""


def run_profile(
    server: BenchServer,
    rows: int,
    *,
    name: str = "null",
    provider: str = "null://",
    flags: Sequence[str] | None = None,
    results: Path = RESULTS,
) -> Profile:
    """Profile one drain of `rows` rows; write the raw samples and the summary. The worker
    runs with `flags`, by default those of the drain benchmarks."""
    results.mkdir(parents=True, exist_ok=True)
    raw = results / f"profile-{name}.txt"
    summary = results / f"profile-{name}.md"
    system = leasebox_system(None if flags is None else list(flags), provider=provider)
    unused = Path(tempfile.gettempdir()) / "leasebox-bench-unused.json"
    tool = _py_spy()
    error = "py-spy is not installed"
    if tool is not None:
        with server.database("profile", leasebox_schema=True) as dsn:
            seed_outbox(dsn, rows)
            settle(dsn)
            error = _profile_with_py_spy(tool, system.worker_command(dsn, unused), raw)
        if not error:
            found = Profile(
                name,
                rows,
                f"py-spy {SAMPLE_RATE} Hz",
                summarise_collapsed(raw.read_text("utf-8")),
                _shown(raw),
                _shown(summary),
            )
            summary.write_text(markdown(found), "utf-8")
            return found
    with server.database("profile", leasebox_schema=True) as dsn:
        seed_outbox(dsn, rows)
        settle(dsn)
        stats_file = Path(tempfile.gettempdir()) / f"leasebox-bench-{name}.prof"
        table, failure = _profile_with_cprofile(system.worker_command(dsn, unused), stats_file)
    if failure:
        return Profile(name, rows, "none", None, "", "", f"{error}; cProfile: {failure}")
    raw = results / f"profile-{name}-cprofile.txt"
    raw.write_text(table, "utf-8")
    summary.write_text(
        f"# Profile: `leasebox worker --drain` ({name}), {rows:,} rows\n\n"
        f"cProfile (py-spy unavailable: {error}); top functions by own time:\n\n"
        f"```\n{table}\n```\n",
        "utf-8",
    )
    return Profile(
        name, rows, "cProfile", None, _shown(raw), _shown(summary), f"py-spy unavailable: {error}"
    )
