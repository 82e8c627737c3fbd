"""Turning a run's results into the printed table, the JSON file and the README's figures.

The JSON holds everything (raw timings, accounting, settings, versions, the machine and its
load); the Markdown tables are what a person reads, printed at the end of a run and, after
a full run, written between the result markers of `bench/README.md`.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent / "README.md"
START_MARK = "<!-- results:start -->"
END_MARK = "<!-- results:end -->"


def machine() -> dict[str, Any]:
    """What the figures were measured on, including how busy it was."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        first = meminfo.read_text().splitlines()[0].split()
        memory = f"{int(first[1]) / 1024 / 1024:.1f} GiB"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def load_average() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(value: object, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    number = float(str(value))
    return f"{number:,.{digits}f}"


def drain_table(drain: Sequence[dict[str, Any]]) -> str:
    cases = sorted({(int(r["rows"]), int(r["processes"])) for r in drain})
    systems = list(dict.fromkeys(str(r["system"]) for r in drain))
    headers = ["system", *[f"{rows // 1000}k x {p}p" for rows, p in cases]]
    body = []
    for system in systems:
        cells: list[object] = [system]
        for rows, processes in cases:
            found = next(
                (
                    r
                    for r in drain
                    if r["system"] == system and r["rows"] == rows and r["processes"] == processes
                ),
                None,
            )
            if found is None:
                cells.append("-")
            elif not found["ok"]:
                cells.append("FAILED" if found["error"] else "NOT EXACTLY ONCE")
            else:
                cells.append(_num(found["rate_per_second"]))
        body.append(cells)
    return _table(headers, body)


def render(results: dict[str, Any]) -> str:
    """The Markdown a person reads: one table per benchmark, then the targets."""
    parts = []
    if results.get("drain"):
        parts.append(
            "**Drain** (rows per second, start-up excluded; every run checked "
            "exactly-once)\n\n" + drain_table(results["drain"])
        )
    if results.get("enqueue"):
        parts.append(
            "**Enqueue** (logical sends per second, one connection)\n\n"
            + _table(
                ["method", "mode", "sends/s"],
                [[r["method"], r["mode"], _num(r["rate_per_second"])] for r in results["enqueue"]],
            )
        )
    if results.get("latency"):
        parts.append(
            "**Latency** (enqueue to sent, from the table)\n\n"
            + _table(
                ["LISTEN/NOTIFY", "target/s", "achieved/s", "p50 ms", "p99 ms", "max ms"],
                [
                    [
                        "on" if r["listen_notify"] else "off (poll)",
                        _num(r["target_rate"]),
                        _num(r["achieved_rate"]),
                        _num(r["p50_ms"], 1),
                        _num(r["p99_ms"], 1),
                        _num(r["max_ms"], 1),
                    ]
                    for r in results["latency"]
                ],
            )
        )
    if results.get("scale"):
        parts.append(
            "**Scale of the table** (milliseconds, median / p95)\n\n"
            + _table(
                ["sent rows", "pending rows", "claim", "backlog query"],
                [
                    [
                        _num(r["sent_rows"]),
                        _num(r["pending_rows"]),
                        f"{_num(r['claim_ms_median'], 2)} / {_num(r['claim_ms_p95'], 2)}",
                        f"{_num(r['backlog_ms_median'], 2)} / {_num(r['backlog_ms_p95'], 2)}",
                    ]
                    for r in results["scale"]
                ],
            )
        )
    if results.get("targets"):
        marks = {True: "met", False: "MISSED", None: "not evaluated"}
        parts.append(
            "**Targets**\n\n"
            + _table(
                ["target", "measured", "result"],
                [[t["goal"], t["measured"], marks[t["met"]]] for t in results["targets"]],
            )
        )
    return "\n\n".join(parts)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n", "utf-8")


def versions_block(results: dict[str, Any]) -> str:
    lines = [f"- {name}: {version}" for name, version in results["versions"].items()]
    info = results["machine"]
    lines.append(
        f"- machine: {info['cpu']}, {info['cores']} cores, {info['memory']}, "
        f"{info['system']}; load average (1, 5, 15 min) {results['load_before']} before, "
        f"{results['load_after']} after"
    )
    settings = dict(results["postgres"])
    version = settings.pop("server_version", "?")
    described = ", ".join(f"{name} {value}" for name, value in settings.items())
    lines.append(f"- PostgreSQL {version} (embedded unless `--server-dsn`): {described}")
    lines.append(f"- run: {results['started_at']}, {results['duration_seconds']:.0f} s")
    return "\n".join(lines)


def update_readme(results: dict[str, Any], readme: Path = README) -> bool:
    """Replace the figures between the result markers; False if the markers are missing."""
    if not readme.exists():
        return False
    text = readme.read_text("utf-8")
    pattern = re.compile(re.escape(START_MARK) + ".*?" + re.escape(END_MARK), re.DOTALL)
    if not pattern.search(text):
        return False
    block = f"{START_MARK}\n{render(results)}\n\n{versions_block(results)}\n{END_MARK}"
    readme.write_text(pattern.sub(lambda _: block, text), "utf-8")
    return True
