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


def _pair(p50: object, p99: object) -> str:
    """A part's p50 / p99 (ms); n/a for a run from before parts were measured."""
    if p50 is None or p99 is None:
        return "n/a"
    return f"{_num(p50, 1)} / {_num(p99, 1)}"


def _cases(drain: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    return sorted({(int(r["rows"]), int(r["processes"])) for r in drain})


def _label(rows: int, processes: int) -> str:
    size = f"{rows / 1_000_000:g}M" if rows >= 1_000_000 else f"{rows / 1000:g}k"
    return f"{size} x {processes}p"


def drain_table(drain: Sequence[dict[str, Any]], figure: str = "rate_per_second") -> str:
    """Systems by (rows, processes): the drain rate, or another figure of each run."""
    cases = _cases(drain)
    systems = list(dict.fromkeys(str(r["system"]) for r in drain))
    headers = ["system", *[_label(rows, p) for rows, p in cases]]
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
                cells.append(_num(found.get(figure), 1 if figure != "rate_per_second" else 0))
        body.append(cells)
    return _table(headers, body)


def _history(history: dict[str, Any]) -> str:
    rows = []
    for case in history["cases"]:
        drain = case.get("drain") or {}
        rate = _num(drain["rate_per_second"]) if drain.get("ok") else "FAILED"
        rows.append(
            [
                _num(case["history_rows"]),
                f"{_num(case['claim_ms_median'], 2)} / {_num(case['claim_ms_p95'], 2)}",
                f"{_num(case['backlog_ms_median'], 2)} / {_num(case['backlog_ms_p95'], 2)}",
                rate,
            ]
        )
    table = _table(
        [
            "sent rows retained",
            "claim 100 ms (median / p95)",
            "backlog ms (median / p95)",
            f"drain {_num(history['ready_rows'])} rows/s",
        ],
        rows,
    )
    prune = history.get("prune_day_seconds")
    notes = (
        f"History seeded with generate_series in {history['seed_seconds']:.0f} s over "
        f"{history['days']} days; retention dropped the oldest day "
        f"({_num(history['pruned_rows'])} of {_num(history['day_rows'])} rows) in "
        f"{'n/a' if prune is None else f'{prune:.3f}'} s."
    )
    if history.get("errors"):
        notes += " Errors: " + "; ".join(history["errors"])
    return table + "\n\n" + notes


def _enqueue(enqueue: Sequence[dict[str, Any]]) -> str:
    return _table(
        ["method", "mode", "sends/s"],
        [
            [r["method"], r["mode"], r["error"] if r.get("error") else _num(r["rate_per_second"])]
            for r in enqueue
        ],
    )


def _providers(providers: dict[str, Any]) -> str:
    rows: list[list[object]] = []
    http = providers.get("http")
    if http:
        label = f"HTTP, {http['delay_ms']:g} ms answers, {http['concurrency']} in flight"
        for method, run in (
            ("bare aiohttp loop", http["bare"]),
            ("leasebox worker", http["worker"]),
        ):
            rows.append(
                [label, method, _rate_or_failure(run), _num(run.get("cpu_us_per_message"), 1)]
            )
    smtp = providers.get("smtp")
    if smtp:
        run = smtp["worker"]
        rows.append(
            [
                f"SMTP (aiosmtpd), pool of {smtp['pool_size']}",
                "leasebox worker",
                _rate_or_failure(run),
                _num(run.get("cpu_us_per_message"), 1),
            ]
        )
    return _table(["provider", "client", "sends/s", "client CPU µs/message"], rows)


def _rate_or_failure(run: dict[str, Any]) -> str:
    if run.get("ok"):
        return _num(run.get("rate_per_second"))
    return f"FAILED: {run.get('error') or run.get('accounting')}"[:120]


def _profile(profile: dict[str, Any]) -> str:
    where = f"`{profile['summary']}`" if profile.get("summary") else "no file"
    if not profile.get("by_package"):
        return f"- {profile['name']}: {profile['tool']}, {profile.get('error') or ''} ({where})"
    shares = ", ".join(f"{p['name']} {p['percent']:.0f}%" for p in profile["by_package"][:6])
    hot = ", ".join(f"`{p['name']}` {p['percent']:.0f}%" for p in profile["self"][:4])
    return (
        f"- {profile['name']}, {_num(profile['rows'])} rows ({profile['tool']}, "
        f"{_num(profile['samples'])} samples, {_num(profile['start_up_samples'])} in start-up): "
        f"{shares}; hottest leaves {hot}. Summary {where}."
    )


def render(results: dict[str, Any]) -> str:
    """The Markdown a person reads: one table per benchmark, then the targets."""
    parts = []
    if results.get("quick"):
        parts.append(
            "_Quick run: sizes too small for the figures to mean anything; it checks that "
            "every benchmark runs and every drain is exactly-once._"
        )
    if results.get("drain"):
        parts.append(
            "**Drain** (rows per second, start-up excluded; every run checked "
            "exactly-once)\n\n" + drain_table(results["drain"])
        )
        parts.append(
            "**Worker CPU per message** (µs of the worker processes' own CPU time, from "
            "`wait4`, start-up excluded)\n\n" + drain_table(results["drain"], "cpu_us_per_message")
        )
    if results.get("history"):
        parts.append("**History** (leasebox, 1 process)\n\n" + _history(results["history"]))
    if results.get("enqueue"):
        parts.append(
            "**Enqueue** (logical sends per second, one connection)\n\n"
            + _enqueue(results["enqueue"])
        )
    if results.get("providers"):
        parts.append(
            "**Providers** (one worker process, loopback stand-ins)\n\n"
            + _providers(results["providers"])
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
    if results.get("otp_backlog"):
        parts.append(
            "**OTP behind a verification backlog** (one worker, null://, enqueue to sent; its"
            " parts as p50 / p99 ms: the producer's own transaction, from the OTP's creation to"
            " the claim that took it, and from that claim to its `sent` row)\n\n"
            + _table(
                [
                    "claim order",
                    "backlog",
                    "OTPs behind it",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "producer's transaction",
                    "to the claim",
                    "claim to sent",
                ],
                [
                    [
                        "priorities" if r["priorities"] else "first in, first out",
                        _num(r["backlog"]),
                        _num(r["otps_behind_the_backlog"]),
                        _num(r["p50_ms"], 1),
                        _num(r["p99_ms"], 1),
                        _num(r["max_ms"], 1),
                        *(
                            _pair(r.get(f"{part}_p50_ms"), r.get(f"{part}_p99_ms"))
                            for part in ("producer_transaction", "to_claim", "claim_to_sent")
                        ),
                    ]
                    for r in results["otp_backlog"]
                ],
            )
        )
    if results.get("quota"):
        parts.append(
            "**Shared quota** (worker processes of one account, burst 1, at the sink's clock)\n\n"
            + _table(
                ["workers", "quota/s", "messages", "measured/s", "of the quota", "ahead s"],
                [
                    [
                        _num(r["workers"]),
                        _num(r["quota_per_second"]),
                        _num(r["received"]),
                        _num(r["rate_per_second"], 2),
                        _num(r["accuracy"], 4),
                        _num(r["ahead_seconds"], 3),
                    ]
                    for r in results["quota"]
                ],
            )
        )
    if results.get("profiles"):
        parts.append(
            "**Profiles of the drain** (share of the drain's CPU samples, start-up left out)\n\n"
            + "\n".join(_profile(p) for p in results["profiles"])
        )
    if results.get("targets"):
        parts.append(
            "**Targets**\n\n"
            + _table(
                ["target", "measured", "ratio", "result"],
                [
                    [
                        t["goal"],
                        t["measured"],
                        "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}",
                        t["status"],
                    ]
                    for t in results["targets"]
                ],
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
