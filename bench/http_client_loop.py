"""The HTTP yardstick: a bare aiohttp client loop with a fixed number of requests in flight.

No database, no templates, no retries: `concurrency` tasks share one `ClientSession` and
POST, one after another, a JSON body shaped like leasebox's (recipient, subject, text, HTML,
delivery key) with an `Idempotency-Key`, until `requests` have been answered. What it
reaches against the HTTP stand-in is the most one process can get out of that API at that
concurrency. It prints one JSON line: seconds from the first request to the last answer,
answers that were 2xx, and the process's CPU seconds during the loop.
Run as `python -m bench.http_client_loop --url URL --requests N --concurrency C`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp


def body(number: int) -> dict[str, Any]:
    return {
        "to": f"user{number}@example.com",
        "subject": "Your verification code",
        "text": f"Your code is {number % 1_000_000:06d}. It is valid for 10 minutes.",
        "html": f"<p>Your code is <strong>{number % 1_000_000:06d}</strong>.</p>",
        "delivery_key": f"otp:bare:{number}",
        "kind": "otp",
        "metadata": {"outbox_id": number, "aggregate_id": f"user-{number}"},
    }


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(url: str, requests: int, concurrency: int) -> dict[str, float | int]:
    numbers = iter(range(requests))
    answered = 0

    async def lane(session: aiohttp.ClientSession) -> None:
        nonlocal answered
        for number in numbers:
            async with session.post(
                url, json=body(number), headers={"Idempotency-Key": f"otp:bare:{number}"}
            ) as response:
                await response.json(content_type=None)
                if 200 <= response.status < 300:
                    answered += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        cpu_before, start = _cpu(), time.perf_counter()
        await asyncio.gather(*(lane(session) for _ in range(concurrency)))
        seconds, cpu = time.perf_counter() - start, _cpu() - cpu_before
    return {"seconds": seconds, "answered": answered, "cpu_seconds": cpu}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a bare aiohttp client loop")
    parser.add_argument("--url", required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args.url, args.requests, args.concurrency))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
