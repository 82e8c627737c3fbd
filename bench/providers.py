"""The provider benchmarks: one worker process against real protocols on loopback.

**HTTP.** The stand-in mail API answers each POST after 50 ms, so sends/s is bounded by
concurrency over latency, and a worker that spends little CPU per message gets close to the
bound. The yardstick is a bare aiohttp client loop with the same number of requests in
flight against the same stand-in (`bench.http_client_loop`); the worker runs `leasebox
worker --drain --provider http://...` with that concurrency. Rounds alternate the two.

**SMTP.** `leasebox worker --drain --provider smtp://...` with its pooled connections to a
local aiosmtpd server: sends/s and the worker's CPU per message, which is where building a
MIME message shows.

Both worker runs are drains like the drain benchmark's (start-up measured on an empty queue
and taken out; CPU from `wait4`), checked exactly-once twice: in the outbox, and by the
delivery keys the stand-in accepted (every seeded key once, nothing else).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.accounting import Accounting, account_ids, combine
from bench.drain import DrainResult, Idle, keep_better, run_case
from bench.pgserver import BenchServer
from bench.standins import HttpMailApi, SmtpServer
from bench.systems import LEASEBOX_BATCH_FLAGS, ROOT, leasebox_system, verify_outbox

SEEDED_KEY_PREFIX = "otp:bench:"
BARE_KEY_PREFIX = "otp:bare:"
SMTP_POOL_SIZE = 8


@dataclass(frozen=True)
class BareResult:
    """The bare client loop's run."""

    requests: int
    concurrency: int
    seconds: float
    cpu_seconds: float
    accounting: Accounting | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.accounting is not None and self.accounting.exactly_once

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "concurrency": self.concurrency,
            "seconds": round(self.seconds, 3),
            "rate_per_second": round(self.rate, 1) if self.ok else None,
            "cpu_us_per_message": round(self.cpu_seconds / self.requests * 1e6, 2)
            if self.ok and self.requests
            else None,
            "accounting": self.accounting.as_dict() if self.accounting else None,
            "ok": self.ok,
            "error": self.error,
        }


def keys_accounting(rows: int, counts: Counter[str], prefix: str) -> Accounting:
    """Exactly-once by the delivery keys a stand-in accepted: each `prefix<n>` once."""
    numbers: list[int] = []
    for key, copies in counts.items():
        tail = key[len(prefix) :] if key.startswith(prefix) else ""
        numbers.extend([int(tail) if tail.isdigit() else -1] * copies)
    return account_ids(rows, numbers, "keys the stand-in accepted")


def _checked_by(
    counts: Callable[[], Counter[str]],
) -> Callable[[str, int, list[Path]], Accounting]:
    def verify(dsn: str, rows: int, files: list[Path]) -> Accounting:
        return combine(
            keys_accounting(rows, counts(), SEEDED_KEY_PREFIX), verify_outbox(dsn, rows, files)
        )

    return verify


def run_bare_loop(
    url: str, requests: int, concurrency: int, counts: Callable[[], Counter[str]]
) -> BareResult:
    """The bare client loop in its own process; `counts` reads what the stand-in saw."""
    command = [
        sys.executable,
        "-m",
        "bench.http_client_loop",
        "--url",
        url,
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return BareResult(
            requests, concurrency, 0.0, 0.0, None, f"exited {done.returncode}: {tail}"
        )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    accounting = keys_accounting(requests, counts(), BARE_KEY_PREFIX)
    error = "" if found["answered"] == requests else f"{found['answered']} of {requests} answered"
    return BareResult(
        requests,
        concurrency,
        float(found["seconds"]),
        float(found["cpu_seconds"]),
        accounting,
        error,
    )


def run_http(
    server: BenchServer,
    rows: int,
    concurrency: int,
    *,
    rounds: int = 2,
    delay_seconds: float = 0.05,
) -> dict[str, Any]:
    """The worker against the HTTP stand-in, beside the bare loop at the same concurrency."""
    best_bare: BareResult | None = None
    best_worker: DrainResult | None = None
    idle: dict[tuple[str, int], Idle] = {}
    with HttpMailApi(delay_seconds) as api:
        system = leasebox_system(
            ["--concurrency", str(concurrency)],
            provider=api.url,
            name="leasebox (http)",
            verify=_checked_by(api.counts.snapshot),
        )
        for _ in range(rounds):
            api.counts.clear()
            bare = run_bare_loop(api.url, rows, concurrency, api.counts.snapshot)
            if best_bare is None or (bare.ok and (not best_bare.ok or bare.rate > best_bare.rate)):
                best_bare = bare
            api.counts.clear()
            worker = run_case(server, system, rows, 1, idle_cache=idle, timeout=600)
            best_worker = keep_better(best_worker, worker)
    assert best_bare is not None
    assert best_worker is not None
    return {
        "delay_ms": delay_seconds * 1000,
        "concurrency": concurrency,
        "messages": rows,
        "bare": best_bare.as_dict(),
        "worker": best_worker.as_dict(),
    }


def run_smtp(server: BenchServer, rows: int, *, rounds: int = 2) -> dict[str, Any]:
    """The worker over pooled SMTP connections to a local aiosmtpd server."""
    best: DrainResult | None = None
    idle: dict[tuple[str, int], Idle] = {}
    with SmtpServer() as smtp:
        system = leasebox_system(
            list(LEASEBOX_BATCH_FLAGS),
            provider=smtp.url(SMTP_POOL_SIZE),
            name="leasebox (smtp)",
            verify=_checked_by(smtp.counts.snapshot),
        )
        for _ in range(rounds):
            smtp.counts.clear()
            best = keep_better(
                best, run_case(server, system, rows, 1, idle_cache=idle, timeout=600)
            )
    assert best is not None
    return {"messages": rows, "pool_size": SMTP_POOL_SIZE, "worker": best.as_dict()}
