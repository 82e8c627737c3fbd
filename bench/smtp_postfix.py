"""The SMTP client benchmark: the provider's own client beside aiosmtplib, against Postfix.

The SMTP provider speaks each mail transaction with its own protocol code (`smtp_wire`), kept
only if it is correct against a real mail server and measurably cheaper than aiosmtplib. The
server is Debian's Postfix, the tests' private instance (`tests/support/postfix.py`: loopback,
PIPELINING, 8BITMIME, SMTPUTF8, STARTTLS, a size limit, delivery into a Maildir). Each round
runs both clients (`bench.smtp_postfix_client`, a process each, alternating which goes first)
with the same concurrency, once over plain SMTP and once over STARTTLS, and checks that every
message of the run was delivered into the Maildir exactly once.

Correctness is the Postfix test suite (`tests/providers/test_smtp_against_postfix.py`), run
first. The target: the suite passes, every run delivers exactly once, and the own client's
CPU per message over plain SMTP (median of the rounds) is at most 0.9x aiosmtplib's.
`python -m bench.smtp_postfix [--messages N] [--quick]`; the JSON goes to
`bench/results/smtp_postfix.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.providers import SMTP_POOL_SIZE
from bench.report import load_average, machine, write_json
from bench.targets import MISSED, NOT_EVALUATED, Target, judged

ROOT = Path(__file__).resolve().parent.parent
# The Postfix instance is the tests' support code, not a copy.
sys.path.insert(0, str(ROOT / "tests"))
from support.postfix import Postfix, PostfixUnavailable, running_postfix  # noqa: E402

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "smtp_postfix.json"
SUITE = "tests/providers/test_smtp_against_postfix.py"
MESSAGES, QUICK_MESSAGES = 5_000, 500
ROUNDS, QUICK_ROUNDS = 3, 1
GOAL = 0.9
CLIENTS = ("own", "aiosmtplib")
_KEY = re.compile(rb"\nX-Leasebox-Delivery-Key: (\S+)\n")


def run_suite() -> dict[str, Any]:
    """The Postfix test suite, in a pytest process of its own: its summary line."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", SUITE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    return {"ok": done.returncode == 0, "summary": lines[-1] if lines else done.stderr[-300:]}


def delivered(postfix: Postfix, prefix: str, expected: int, timeout: float = 300.0) -> Counter[str]:
    """The delivery keys starting with `prefix` in the Maildir, once `expected` of them came
    (or the time is up) and the queue is empty; their files are removed."""
    deadline = time.monotonic() + timeout
    inbox = postfix.inbox / "new"
    keys: dict[Path, str] = {}
    while True:
        for path in inbox.glob("*") if inbox.exists() else ():
            if path not in keys:
                found = _KEY.search(path.read_bytes())
                keys[path] = found.group(1).decode() if found else "?"
        mine = {path: key for path, key in keys.items() if key.startswith(prefix)}
        done = len(mine) >= expected and postfix.queue_empty()
        if done or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    for path in mine:
        path.unlink()
    return Counter(mine.values())


def exactly_once(keys: Counter[str], prefix: str, messages: int, warm_up: int) -> bool:
    wanted = [f"{prefix}{n}" for n in range(messages)] + [f"{prefix}w{n}" for n in range(warm_up)]
    return sorted(keys.elements()) == sorted(wanted)


def run_client(
    postfix: Postfix, client: str, *, tls: bool, messages: int, prefix: str
) -> dict[str, Any]:
    """One client's run in its own process, and what Postfix delivered of it."""
    command = [
        sys.executable,
        "-m",
        "bench.smtp_postfix_client",
        f"--client={client}",
        f"--port={postfix.port}",
        f"--messages={messages}",
        f"--concurrency={SMTP_POOL_SIZE}",
        f"--prefix={prefix}",
        *(["--tls"] if tls else []),
    ]
    env = {**os.environ, "SSL_CERT_FILE": str(postfix.certificates.ca_file)}
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900, check=False
    )
    result: dict[str, Any] = {"client": client, "tls": tls, "messages": messages}
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {**result, "error": f"exited {done.returncode}: {tail}", "exactly_once": False}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    keys = delivered(postfix, prefix, messages + found["warm_up"])
    seconds, cpu = float(found["seconds"]), float(found["cpu_seconds"])
    return {
        **result,
        "seconds": round(seconds, 3),
        "failed": found["failed"],
        "rate_per_second": round(messages / seconds, 1),
        "cpu_us_per_message": round(cpu / messages * 1e6, 1),
        "exactly_once": exactly_once(keys, prefix, messages, found["warm_up"]),
        "error": "",
    }


def summary(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per transport and client: the median of the rounds' sends/s and CPU per message."""
    rows = []
    for tls in (False, True):
        for client in CLIENTS:
            mine = [r for r in runs if r["client"] == client and r["tls"] == tls]
            good = [r for r in mine if not r["error"] and r["exactly_once"] and not r["failed"]]
            rows.append(
                {
                    "transport": "STARTTLS" if tls else "plain",
                    "client": client,
                    "runs": len(mine),
                    "ok": bool(mine) and len(good) == len(mine),
                    "rate_per_second": _median(good, "rate_per_second"),
                    "cpu_us_per_message": _median(good, "cpu_us_per_message"),
                }
            )
    return rows


def _median(runs: Sequence[dict[str, Any]], name: str) -> float | None:
    return round(statistics.median(r[name] for r in runs), 1) if runs else None


def _ratio(rows: Sequence[dict[str, Any]], transport: str) -> float | None:
    own, theirs = (
        next(r for r in rows if r["transport"] == transport and r["client"] == client)
        for client in CLIENTS
    )
    if not (own["ok"] and theirs["ok"] and theirs["cpu_us_per_message"]):
        return None
    return float(own["cpu_us_per_message"]) / float(theirs["cpu_us_per_message"])


def evaluate(rows: Sequence[dict[str, Any]], suite: dict[str, Any]) -> dict[str, Any]:
    plain, tls = _ratio(rows, "plain"), _ratio(rows, "STARTTLS")
    goal = (
        "own SMTP client correct against Postfix and measurably cheaper: CPU per message "
        f"own/aiosmtplib <= {GOAL} (plain SMTP), the Postfix suite passing"
    )
    shown = "n/a" if tls is None else f"{tls:.2f}"
    measured = f"CPU/message own/aiosmtplib, STARTTLS {shown}; suite: {suite['summary']}"
    target = judged("smtp client", goal, plain, measured, at_most=GOAL)
    if target.status != NOT_EVALUATED and not suite["ok"]:
        target = Target(target.name, goal, measured, target.ratio, False, MISSED)
    return target.as_dict()


def versions(postfix: Postfix) -> dict[str, str]:
    return {
        "postfix": postfix.version,
        "python": sys.version.split()[0],
        "aiosmtplib": version("aiosmtplib"),
        "uvloop": version("uvloop"),
        "openssl": ssl.OPENSSL_VERSION,
        "leasebox": version("leasebox"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    messages = args.messages or (QUICK_MESSAGES if args.quick else MESSAGES)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    started = time.time()
    load_before = load_average()
    suite = run_suite()
    runs: list[dict[str, Any]] = []
    with running_postfix() as postfix:
        for number in range(rounds):
            for tls in (False, True):
                order = CLIENTS if number % 2 == 0 else CLIENTS[::-1]
                for client in order:
                    prefix = f"otp:{client}:{'tls' if tls else 'plain'}:{number}:"
                    runs.append(
                        run_client(postfix, client, tls=tls, messages=messages, prefix=prefix)
                    )
        found_versions = versions(postfix)
    rows = summary(runs)
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_seconds": round(time.time() - started, 1),
        "machine": machine(),
        "load_before": load_before,
        "load_after": load_average(),
        "versions": found_versions,
        "concurrency": SMTP_POOL_SIZE,
        "suite": suite,
        "runs": runs,
        "summary": rows,
        "target": evaluate(rows, suite),
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"**SMTP against Postfix {results['versions']['postfix']}** (loopback, "
        f"{results['concurrency']} connections; medians of the rounds)",
        "",
        "| transport | client | sends/s | CPU µs/message | exactly once |",
        "|---|---|---:|---:|---:|",
    ]
    for row in results["summary"]:
        rate, cpu = row["rate_per_second"], row["cpu_us_per_message"]
        lines.append(
            f"| {row['transport']} | {row['client']} | "
            f"{'n/a' if rate is None else f'{rate:,.0f}'} | "
            f"{'n/a' if cpu is None else f'{cpu:,.0f}'} | {row['ok']} |"
        )
    target = results["target"]
    ratio = "n/a" if target["ratio"] is None else f"{target['ratio']:.2f}"
    lines += ["", f"Target: {target['goal']}: {target['measured']}, {ratio}, {target['status']}"]
    return "\n".join(lines)


def unavailable(reason: str) -> dict[str, Any]:
    goal = "own SMTP client correct against Postfix and measurably cheaper than aiosmtplib"
    return {
        "machine": machine(),
        "error": reason,
        "target": judged("smtp client", goal, None, f"not run: {reason}").as_dict(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.smtp_postfix", description=__doc__)
    parser.add_argument("--messages", type=int, help=f"timed sends per run ({MESSAGES:,})")
    parser.add_argument("--rounds", type=int, help=f"rounds of every run ({ROUNDS})")
    parser.add_argument(
        "--quick",
        action="store_true",
        default=bool(os.environ.get("BENCH_QUICK")),
        help=f"{QUICK_MESSAGES:,} sends, one round: checks the harness, not the figures",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results = run(args)
    except PostfixUnavailable as exc:
        results = unavailable(str(exc))
        write_json(results, args.json)
        target = results["target"]
        print(f"Target: {target['goal']}: {target['measured']}, n/a, {target['status']}")
        return 1 if os.environ.get("CI") else 0
    write_json(results, args.json)
    print(render(results))
    return 0 if all(row["ok"] for row in results["summary"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
