"""The targets of the performance issue, checked against one run's figures: pure, so tested.

Every target compares a leasebox figure with its yardstick measured in the same run on the
same server (a peer, the plain loop on the minimal table, leasebox's own figure at another
size, a bare client), or, where the issue sets an absolute bound (CPU per message, latency,
retention time), with that bound. Each carries the ratio it was judged on. A target whose
inputs are missing (a peer skipped, a benchmark not run, a failed run) is *not evaluated*,
never met; a product feature the issue asks for that does not exist yet is *missing*; a
figure reported beside its yardstick without a bound of its own is *reported*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.accounting import ratio
from bench.systems import (
    LEASEBOX,
    PLAIN_LEASEBOX_SCHEMA,
    PLAIN_MINIMAL,
    STATEMENTS_WITH_HISTORY,
    STATEMENTS_WITHOUT_HISTORY,
    YARDSTICKS,
)

# The drain's bounds: ahead of the best peer by this much, and at least this share of the
# plain loop on a minimal table (the workload's limit on the machine).
PEER_MARGIN = 1.2
LIMIT_SHARE = 0.8
# Worker CPU per message: at most CPU_BOUND_US, judged on a host where the minimal loop's own
# CPU per message is under CPU_HOST_US (on a slower host the bound says nothing of the code).
CPU_BOUND_US = 15.0
CPU_HOST_US = 10.0

MET, MISSED, NOT_EVALUATED, MISSING, REPORTED = (
    "met",
    "MISSED",
    "not evaluated",
    "missing",
    "reported",
)


@dataclass(frozen=True)
class Target:
    name: str
    goal: str
    measured: str
    ratio: float | None
    met: bool | None
    status: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "goal": self.goal,
            "measured": self.measured,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "met": self.met,
            "status": self.status,
        }


def judged(
    name: str,
    goal: str,
    value: float | None,
    measured: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> Target:
    """A target met when `value` clears its bound; not evaluated without a value."""
    if value is None:
        return Target(name, goal, measured, None, None, NOT_EVALUATED)
    met = (
        (at_least is None or value >= at_least)
        and (above is None or value > above)
        and (at_most is None or value <= at_most)
        and (below is None or value < below)
    )
    return Target(name, goal, measured, value, met, MET if met else MISSED)


def reported(name: str, goal: str, value: float | None, measured: str) -> Target:
    return Target(
        name, goal, measured, value, None, REPORTED if value is not None else NOT_EVALUATED
    )


def _rate(
    drain: Sequence[Mapping[str, Any]], system: str, rows: int, processes: int
) -> float | None:
    for row in drain:
        if (row["system"], row["rows"], row["processes"]) == (system, rows, processes):
            return float(row["rate_per_second"]) if row["ok"] else None
    return None


def _row(
    drain: Sequence[Mapping[str, Any]], system: str, rows: int, processes: int
) -> Mapping[str, Any] | None:
    return next(
        (r for r in drain if (r["system"], r["rows"], r["processes"]) == (system, rows, processes)),
        None,
    )


def per_second(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}/s"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _k(rows: int) -> str:
    return f"{rows / 1_000_000:g}M" if rows >= 1_000_000 else f"{rows / 1000:g}k"


def drain_targets(
    drain: Sequence[Mapping[str, Any]], sizes: Sequence[int], backlog: int | None = None
) -> list[Target]:
    """Ahead of every peer by at least 1.2x, at least 0.8x the workload's limit, and steady
    at a backlog."""
    found: list[Target] = []
    processes = sorted({int(r["processes"]) for r in drain if r["rows"] in sizes})
    for rows in sizes:
        for count in processes:
            mine = _rate(drain, LEASEBOX, rows, count)
            peers = {
                str(r["system"]): _rate(drain, str(r["system"]), rows, count)
                for r in drain
                if r["rows"] == rows
                and r["processes"] == count
                and r["system"] != LEASEBOX
                and r["system"] not in YARDSTICKS
            }
            measured = {n: v for n, v in peers.items() if v is not None}
            best = max(measured, key=lambda n: measured[n], default=None)
            failed = sorted(n for n, v in peers.items() if v is None)
            top = measured.get(best or "")
            detail = (
                f"leasebox {per_second(mine)}, best peer {best} {per_second(top)}"
                if best is not None
                else f"leasebox {per_second(mine)}, no peer measured"
            )
            if failed:
                detail += f" ({', '.join(failed)} failed: not counted)"
            found.append(
                judged(
                    f"drain-{_k(rows)}-{count}p-ahead",
                    f"drain {rows:,} rows, {count} process(es): >= {PEER_MARGIN}x every peer",
                    ratio(mine, top),
                    detail,
                    at_least=PEER_MARGIN,
                )
            )
        mine = _rate(drain, LEASEBOX, rows, 1)
        limit = _rate(drain, PLAIN_MINIMAL, rows, 1)
        found.append(
            judged(
                f"drain-{_k(rows)}-1p-vs-limit",
                f"drain {rows:,} rows, 1 process: >= {LIMIT_SHARE}x the plain loop on a minimal "
                "table",
                ratio(mine, limit),
                f"{per_second(mine)} vs {per_second(limit)}",
                at_least=LIMIT_SHARE,
            )
        )
        schema = _rate(drain, PLAIN_LEASEBOX_SCHEMA, rows, 1)
        found.append(
            reported(
                f"drain-{_k(rows)}-1p-vs-schema",
                f"drain {rows:,} rows, 1 process: against the plain loop on leasebox's schema",
                ratio(mine, schema),
                f"{per_second(mine)} vs {per_second(schema)} (the schema alone: "
                f"{times(ratio(schema, limit))} the limit)",
            )
        )
    found += history_cost_targets(drain, sizes)
    if backlog is not None and sizes:
        small = min(sizes)
        mine, before = _rate(drain, LEASEBOX, backlog, 1), _rate(drain, LEASEBOX, small, 1)
        steady = ratio(
            _rate(drain, PLAIN_MINIMAL, backlog, 1), _rate(drain, PLAIN_MINIMAL, small, 1)
        )
        found.append(
            judged(
                f"drain-{_k(backlog)}-backlog",
                f"drain at a {backlog:,}-row backlog, 1 process: within 10% of {small:,} rows",
                ratio(mine, before),
                f"{per_second(mine)} vs {per_second(before)}; the minimal table {times(steady)}",
                at_least=0.9,
            )
        )
    return found


def history_cost_targets(drain: Sequence[Mapping[str, Any]], sizes: Sequence[int]) -> list[Target]:
    """What writing the attempt history costs leasebox's claim and mark_sent statements on
    their own, where both loops ran: the most it can cost the worker, whose drain also waits
    on its own work (reported beside the worker's figures; see bench/README.md)."""
    found: list[Target] = []
    for rows in sizes:
        if _row(drain, STATEMENTS_WITH_HISTORY, rows, 1) is None:
            continue
        on = _rate(drain, STATEMENTS_WITH_HISTORY, rows, 1)
        off = _rate(drain, STATEMENTS_WITHOUT_HISTORY, rows, 1)
        found.append(
            reported(
                f"history-cost-{_k(rows)}",
                f"attempt history, {rows:,} rows, 1 process: leasebox's claim and mark_sent "
                "with it against the same without",
                ratio(on, off),
                f"{per_second(on)} with it vs {per_second(off)} without",
            )
        )
    return found


def cpu_target(drain: Sequence[Mapping[str, Any]]) -> list[Target]:
    """Worker CPU per message with `null://`, from the largest one-process leasebox drain
    (the most messages over the same start-up: the most precise figure). Its bound is judged
    where the minimal loop of the same drain needs under 10 µs (on a slower host it is only
    reported), and its ratio to the minimal loop's own is always reported."""
    drained = [r for r in drain if r["system"] == LEASEBOX and r["processes"] == 1 and r["ok"]]
    goal = f"worker CPU per message, null://: <= {CPU_BOUND_US:g} µs"
    if not drained:
        return [
            judged("cpu-null", goal, None, "n/a"),
            reported(
                "cpu-null-vs-minimal",
                "worker CPU per message against the minimal loop's",
                None,
                "n/a",
            ),
        ]
    rows = max(int(r["rows"]) for r in drained)
    value = _row(drain, LEASEBOX, rows, 1) or {}
    cpu = value.get("cpu_us_per_message")
    limit = _row(drain, PLAIN_MINIMAL, rows, 1) or {}
    plain = limit.get("cpu_us_per_message") if limit.get("ok") else None
    mine = "n/a" if cpu is None else f"{cpu:.1f} µs"
    theirs = "n/a" if plain is None else f"{plain:.1f} µs"
    goal = (
        f"worker CPU per message, null://, {rows:,} rows: <= {CPU_BOUND_US:g} µs where the "
        f"minimal loop needs < {CPU_HOST_US:g} µs"
    )
    measured = f"{mine} (the minimal loop: {theirs}); ratio is to the {CPU_BOUND_US:g} µs bound"
    share = None if cpu is None else float(cpu) / CPU_BOUND_US
    if plain is None or cpu is None:
        bound = judged("cpu-null", goal, None, measured)
    elif float(plain) < CPU_HOST_US:
        bound = judged("cpu-null", goal, share, measured, at_most=1.0)
    else:
        bound = reported(
            "cpu-null",
            goal,
            share,
            f"{measured}; not judged: the minimal loop needs {theirs} on this host",
        )
    return [
        bound,
        reported(
            "cpu-null-vs-minimal",
            f"worker CPU per message, null://, {rows:,} rows: against the minimal loop's",
            None if cpu is None or plain is None else ratio(float(cpu), float(plain)),
            f"{mine} vs {theirs}",
        ),
    ]


def history_targets(history: Mapping[str, Any] | None) -> list[Target]:
    if not history or len(history.get("cases", [])) < 2:
        return []
    empty, kept = history["cases"][0], history["cases"][-1]
    rows = f"{kept['history_rows']:,}"
    found = []
    for query in ("claim", "backlog"):
        before, after = float(empty[f"{query}_ms_median"]), float(kept[f"{query}_ms_median"])
        found.append(
            judged(
                f"history-{query}",
                f"{query} with {rows} sent rows retained: within 10% of an empty history",
                ratio(after, before),
                f"{after:.2f} ms vs {before:.2f} ms (medians)",
                at_most=1.1,
            )
        )
    rate = {
        "empty": (empty.get("drain") or {}).get("rate_per_second")
        if (empty.get("drain") or {}).get("ok")
        else None,
        "kept": (kept.get("drain") or {}).get("rate_per_second")
        if (kept.get("drain") or {}).get("ok")
        else None,
    }
    found.append(
        judged(
            "history-drain",
            f"drain with {rows} sent rows retained: within 10% of an empty history",
            ratio(rate["kept"], rate["empty"]),
            f"{per_second(rate['kept'])} vs {per_second(rate['empty'])}",
            at_least=0.9,
        )
    )
    seconds = history.get("prune_day_seconds")
    clean = not history.get("errors")
    found.append(
        judged(
            "history-retention",
            "retention drops a day of history in well under a second (< 1 s)",
            float(seconds) if seconds is not None and clean else None,
            f"{seconds if seconds is not None else 'n/a'} s for {history.get('pruned_rows', 0):,} "
            f"rows (the day held {history.get('day_rows', 0):,}); ratio is to 1 s",
            below=1.0,
        )
    )
    return found


def _enqueue_rate(
    enqueue: Sequence[Mapping[str, Any]], method: str, mode: str
) -> tuple[float | None, str]:
    for row in enqueue:
        if (row["method"], row["mode"]) == (method, mode):
            return row["rate_per_second"], str(row.get("error") or "")
    return None, "not run"


def enqueue_peer_targets(enqueue: Sequence[Mapping[str, Any]]) -> list[Target]:
    """leasebox's producer ahead of the peers' producers, each with its own key per message:
    `enqueue` with a receipt against PgQueuer's `enqueue` with a `dedupe_key` and pg-boss's
    `send` with a `singletonKey`, one per transaction, and `enqueue_many` against their batch
    calls. A peer that failed is named and not counted; without a peer, not evaluated."""
    from bench.enqueue_peers import PGBOSS_MANY, PGBOSS_ONE, PGQUEUER
    from bench.enqueue_rate import LEASEBOX, LEASEBOX_MANY, MANY, ONE

    found = []
    for name, mode, method, peers in (
        ("enqueue-single-vs-peers", ONE, LEASEBOX, (PGQUEUER, PGBOSS_ONE)),
        ("enqueue-batch-vs-peers", MANY, LEASEBOX_MANY, (PGQUEUER, PGBOSS_MANY)),
    ):
        mine, error = _enqueue_rate(enqueue, method, mode)
        goal = f"{method}, {mode}: ahead of every peer's producer"
        if error.startswith("missing"):
            found.append(Target(name, goal, error, None, None, MISSING))
            continue
        rates = {p: _enqueue_rate(enqueue, p, mode) for p in peers}
        measured = {p: r for p, (r, e) in rates.items() if r is not None and not e}
        failed = sorted(p for p, (_, e) in rates.items() if e and e != "not run")
        best = max(measured, key=lambda p: measured[p], default=None)
        top = measured.get(best or "")
        detail = (
            f"leasebox {per_second(mine)}, best peer {best} {per_second(top)}"
            if best is not None
            else f"leasebox {per_second(mine)}, no peer measured"
        )
        if failed:
            detail += f" ({', '.join(failed)} failed: not counted)"
        found.append(judged(name, goal, ratio(mine if not error else None, top), detail, above=1.0))
    return found


def enqueue_targets(enqueue: Sequence[Mapping[str, Any]]) -> list[Target]:
    """The producer against its peers (judged), then against a plain `INSERT` of its one
    row, and its own statements with their arguments ready (reported): a receipt-keyed send
    writes three rows and probes one, so the plain insert bounds it, it does not judge it."""
    from bench.enqueue_rate import (
        LEASEBOX,
        LEASEBOX_MANY,
        LEASEBOX_MANY_STATEMENTS,
        LEASEBOX_STATEMENT,
        LOOP,
        MANY,
        ONE,
        PLAIN,
        PLAIN_MANY,
        WRAPPED,
    )

    if not enqueue:
        return []
    found = enqueue_peer_targets(enqueue)
    for name, method, mode, yardstick in (
        ("enqueue-single", LEASEBOX, ONE, PLAIN),
        ("enqueue-batch", LEASEBOX_MANY, MANY, PLAIN_MANY),
        ("enqueue-wrapped", LEASEBOX, WRAPPED, PLAIN),
        ("enqueue-loop", LEASEBOX, LOOP, PLAIN),
        ("enqueue-single-statement", LEASEBOX_STATEMENT, ONE, PLAIN),
        ("enqueue-batch-statements", LEASEBOX_MANY_STATEMENTS, MANY, PLAIN_MANY),
    ):
        mine, error = _enqueue_rate(enqueue, method, mode)
        plain, _ = _enqueue_rate(enqueue, yardstick, mode)
        goal = f"{method}, {mode}: against {yardstick}"
        if error.startswith("missing") and method == LEASEBOX_MANY:
            found.append(Target(name, goal, error, None, None, MISSING))
            continue
        found.append(
            reported(
                name,
                goal,
                ratio(mine, plain),
                f"{per_second(mine)} vs {per_second(plain)}" + (f" ({error})" if error else ""),
            )
        )
    return found


def provider_targets(providers: Mapping[str, Any] | None) -> list[Target]:
    if not providers:
        return []
    found = []
    http = providers.get("http")
    if http:
        worker, bare = http["worker"], http["bare"]
        mine = worker["rate_per_second"] if worker["ok"] else None
        plain = bare["rate_per_second"] if bare["ok"] else None
        found.append(
            judged(
                "provider-http",
                f"HTTP API answering in {http['delay_ms']:g} ms, concurrency "
                f"{http['concurrency']}: >= 0.8x a bare aiohttp loop",
                ratio(mine, plain),
                f"{per_second(mine)} vs {per_second(plain)}; worker CPU "
                f"{worker.get('cpu_us_per_message') or 'n/a'} µs/message",
                at_least=0.8,
            )
        )
    smtp = providers.get("smtp")
    if smtp:
        worker = smtp["worker"]
        cpu = worker.get("cpu_us_per_message") if worker["ok"] else None
        found.append(
            judged(
                "provider-smtp-cpu",
                f"SMTP, {smtp['pool_size']} pooled connections: worker CPU <= 200 µs/message",
                None if cpu is None else float(cpu) / 200.0,
                f"{'n/a' if cpu is None else f'{cpu:.0f} µs'} at "
                f"{per_second(worker['rate_per_second'] if worker['ok'] else None)}; "
                "ratio is to the 200 µs bound",
                at_most=1.0,
            )
        )
    return found


def latency_targets(latency: Sequence[Mapping[str, Any]]) -> list[Target]:
    found = []
    for row in latency:
        if not row["listen_notify"]:
            continue
        p99 = row["p99_ms"]
        achieved = float(row["achieved_rate"])
        held = achieved >= 0.95 * float(row["target_rate"])
        value = None if p99 is None or row["error"] or not held else float(p99) / 10.0
        found.append(
            judged(
                "latency-notify",
                f"p99 enqueue-to-sent < 10 ms at {row['target_rate']:g}/s with LISTEN/NOTIFY",
                value,
                f"p99 {p99 if p99 is not None else 'n/a'} ms, p50 {row['p50_ms']} ms at "
                f"{achieved:.0f}/s{'' if held else ' (rate not held)'}; ratio is to 10 ms",
                below=1.0,
            )
        )
    return found


def otp_backlog_targets(rows: Sequence[Mapping[str, Any]]) -> list[Target]:
    """An OTP behind a verification backlog is sent within the latency target's p99."""
    found = []
    for row in rows:
        if not row["priorities"]:
            continue
        p99 = row["p99_ms"]
        value = None if p99 is None or row["error"] else float(p99) / 10.0
        fifo = next((r for r in rows if not r["priorities"]), None)
        yardstick = "" if fifo is None else f"; first in, first out: p99 {fifo['p99_ms']} ms"
        parts = ", ".join(
            f"{name} {row[key]} ms"
            for name, key in (
                ("the producer's transaction", "producer_transaction_p99_ms"),
                ("to the claim", "to_claim_p99_ms"),
                ("claim to sent", "claim_to_sent_p99_ms"),
            )
            if row.get(key) is not None
        )
        if parts:
            yardstick += f"; parts at p99: {parts}"
        found.append(
            judged(
                "otp-behind-backlog",
                f"p99 OTP enqueue-to-sent < 10 ms behind {row['backlog']:,} verifications",
                value,
                f"p99 {p99} ms, p50 {row['p50_ms']} ms of the {row['otps_behind_the_backlog']} "
                f"OTPs enqueued behind it{yardstick}; ratio is to 10 ms",
                below=1.0,
            )
        )
    return found


def quota_targets(rows: Sequence[Mapping[str, Any]]) -> list[Target]:
    """The account's rate holds within 5 % however many workers share it."""
    found = []
    for row in rows:
        accuracy = row["accuracy"]
        value = None if accuracy is None or row["error"] else abs(float(accuracy) - 1) / 0.05
        found.append(
            judged(
                f"quota-{row['workers']}-workers",
                f"a {row['quota_per_second']:g}/s quota within 5 % shared by "
                f"{row['workers']} workers",
                value,
                f"{row['rate_per_second']}/s at the sink ({accuracy} of the quota), furthest "
                f"ahead of the quota's pace {row['ahead_seconds']} s; ratio is the deviation "
                "over 5 %",
                at_most=1.0,
            )
        )
    return found


def all_targets(results: Mapping[str, Any]) -> list[Target]:
    """Every target the run has figures for, in the issue's order."""
    drain = results.get("drain", [])
    sizes = results.get("drain_sizes", [])
    found: list[Target] = []
    if drain:
        found += drain_targets(drain, sizes, results.get("backlog_rows"))
        found += cpu_target(drain)
    found += history_targets(results.get("history"))
    found += enqueue_targets(results.get("enqueue", []))
    found += provider_targets(results.get("providers"))
    found += latency_targets(results.get("latency", []))
    found += otp_backlog_targets(results.get("otp_backlog", []))
    found += quota_targets(results.get("quota", []))
    return found
