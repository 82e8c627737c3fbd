"""The benchmark targets, checked against one run's figures: pure, so they are tested.

Targets compare systems measured in the same run on the same server; an absolute figure
appears only for latency, whose target is absolute. A target whose inputs are missing
(a peer skipped, a benchmark not run) is reported as not evaluated, never as met.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.accounting import ratio

LEASEBOX = "leasebox"
PLAIN = "plain-psycopg"
PGQUEUER = "PgQueuer"


@dataclass(frozen=True)
class Target:
    name: str
    goal: str
    measured: str
    met: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "goal": self.goal, "measured": self.measured, "met": self.met}


def _rate(drain: Sequence[dict[str, Any]], system: str, rows: int, processes: int) -> float | None:
    for row in drain:
        if (row["system"], row["rows"], row["processes"]) == (system, rows, processes):
            return float(row["rate_per_second"]) if row["ok"] else None
    return None


def _fmt(value: float | None, suffix: str = "x") -> str:
    if value is None:
        return "n/a"
    if suffix == "/s":
        return f"{value:,.0f}/s"
    return f"{value:.2f}{suffix}"


def _at_least(name: str, goal: str, value: float | None, floor: float, detail: str) -> Target:
    met = None if value is None else value >= floor
    return Target(name, goal, f"{_fmt(value)} ({detail})", met)


def drain_targets(drain: Sequence[dict[str, Any]], small: int, large: int) -> list[Target]:
    found = []
    lb_small = _rate(drain, LEASEBOX, small, 1)
    pgq = _rate(drain, PGQUEUER, small, 1)
    plain = _rate(drain, PLAIN, small, 1)
    found.append(
        _at_least(
            "drain-vs-pgqueuer",
            f"drain {small:,} rows, 1 process: leasebox >= 1.0x PgQueuer",
            ratio(lb_small, pgq),
            1.0,
            f"{_fmt(lb_small, '/s')} vs {_fmt(pgq, '/s')}",
        )
    )
    found.append(
        _at_least(
            "drain-vs-plain",
            f"drain {small:,} rows, 1 process: leasebox >= 0.5x plain baseline",
            ratio(lb_small, plain),
            0.5,
            f"{_fmt(lb_small, '/s')} vs {_fmt(plain, '/s')}",
        )
    )
    processes = sorted({int(r["processes"]) for r in drain if r["rows"] == large})
    for count in processes:
        mine = _rate(drain, LEASEBOX, large, count)
        peers = {
            str(r["system"]): _rate(drain, str(r["system"]), large, count)
            for r in drain
            if r["rows"] == large
            and r["processes"] == count
            and r["system"] not in (LEASEBOX, PLAIN)
        }
        measured = [v for v in peers.values() if v is not None]
        best_name = max(
            (n for n in peers if peers[n] is not None), key=lambda n: peers[n] or 0.0, default=None
        )
        best = max(measured, default=None)
        met = None if mine is None or best is None else mine > best
        found.append(
            Target(
                f"drain-{large // 1000}k-ahead-{count}p",
                f"drain {large:,} rows, {count} process(es): leasebox ahead of every peer",
                f"leasebox {_fmt(mine, '/s')}, best peer {best_name} {_fmt(best, '/s')}",
                met,
            )
        )
        own_small = _rate(drain, LEASEBOX, small, count)
        found.append(
            _at_least(
                f"drain-{large // 1000}k-steady-{count}p",
                f"drain {count} process(es): leasebox rate at {large:,} within 10% of {small:,}",
                ratio(mine, own_small),
                0.9,
                f"{_fmt(mine, '/s')} vs {_fmt(own_small, '/s')}",
            )
        )
    return found


def enqueue_targets(enqueue: Sequence[dict[str, Any]]) -> list[Target]:
    found = []
    for mode in dict.fromkeys(str(r["mode"]) for r in enqueue):
        rates = {
            str(r["method"]): float(r["rate_per_second"]) for r in enqueue if r["mode"] == mode
        }
        mine = next((v for k, v in rates.items() if k.startswith("leasebox")), None)
        plain = next((v for k, v in rates.items() if k.startswith("plain")), None)
        found.append(
            _at_least(
                f"enqueue-{mode.split()[0]}",
                f"enqueue with receipts, {mode}: >= 0.7x plain INSERT",
                ratio(mine, plain),
                0.7,
                f"{_fmt(mine, '/s')} vs {_fmt(plain, '/s')}",
            )
        )
    return found


def scale_targets(scale: Sequence[dict[str, Any]]) -> list[Target]:
    if len(scale) < 2:
        return []
    small, large = scale[0], scale[-1]
    found = []
    for query in ("claim", "backlog"):
        before = float(small[f"{query}_ms_median"])
        after = float(large[f"{query}_ms_median"])
        value = ratio(after, before)
        met = None if value is None else value <= 2.0
        found.append(
            Target(
                f"scale-{query}",
                f"{query} at {large['sent_rows']:,} sent rows <= 2x its time at "
                f"{small['sent_rows']:,}",
                f"{_fmt(value)} ({before:.2f} ms -> {after:.2f} ms, medians)",
                met,
            )
        )
    return found


def latency_targets(latency: Sequence[dict[str, Any]]) -> list[Target]:
    found = []
    for row in latency:
        if not row["listen_notify"]:
            continue
        p99 = row["p99_ms"]
        achieved = float(row["achieved_rate"])
        rate_held = achieved >= 0.95 * float(row["target_rate"])
        met = None if p99 is None or row["error"] else (p99 < 100.0 and rate_held)
        found.append(
            Target(
                "latency-notify",
                f"p99 enqueue-to-sent < 100 ms at {row['target_rate']:g}/s with LISTEN/NOTIFY",
                f"p99 {_fmt(p99, ' ms')}, p50 {_fmt(row['p50_ms'], ' ms')} at {achieved:.0f}/s",
                met,
            )
        )
    return found
