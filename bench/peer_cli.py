"""What every peer worker script shares: its command line, its payloads and its job record.

Each peer runs as its own process, started by the drain benchmark as
`python -m bench.peer_<name> seed|work --dsn URL ...`. `seed --rows 0` installs the peer's
schema and `seed --rows N` writes the jobs (neither is timed); `work` drains them and, at
exit, writes the payload number of every job it ran to `--ids-file`, which is how
exactly-once is checked for peers whose tables forget finished jobs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SEED_CHUNK = 10_000


def payload(number: int) -> dict[str, Any]:
    """The job every system carries: the same small OTP-shaped document."""
    return {
        "i": number,
        "recipient": f"user{number}@example.com",
        "template": "otp",
        "data": {"name": f"User {number}"},
    }


def chunks(total: int, size: int = SEED_CHUNK) -> list[range]:
    return [range(start, min(start + size, total)) for start in range(0, total, size)]


def parse(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("mode", choices=("seed", "work"))
    parser.add_argument("--dsn", required=True, help="postgresql:// URL of the database")
    parser.add_argument("--rows", type=int, default=0, help="jobs to seed (seed mode)")
    parser.add_argument("--ids-file", type=Path, help="where to record the jobs run (work mode)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=0, help="0: the peer's bench default")
    parser.add_argument(
        "--table",
        choices=("leasebox", "minimal", "statements", "statements-no-history"),
        default="leasebox",
        help="the plain loop's table (leasebox's outbox or the minimal one), or leasebox's "
        "own statements on its outbox, with or without their history inserts",
    )
    return parser.parse_args(argv)


def write_ids(path: Path | None, seen: list[int]) -> None:
    if path is not None:
        path.write_text(json.dumps(seen), "utf-8")
