"""One SMTP client's sends against the bench's Postfix, in a process of its own.

`own` is the SMTP provider as the worker runs it (`SmtpProvider.send`: the message built by
`build_mime`, the transaction spoken by `smtp_wire` over pooled connections). `aiosmtplib` is
a bare loop over the same number of `aiosmtplib.SMTP` connections, each sending the same
`build_mime` bytes with `sendmail`: no slots, no expiry checks, no error mapping, so it is
the least a provider built on aiosmtplib could cost. Both run on the worker's default event
loop (uvloop), open their connections and send one message on each before the clock starts,
then keep `concurrency` sends in flight until `messages` were accepted.

It prints one JSON line: seconds from the first send to the last acceptance, the sends that
failed, and the process's CPU seconds over the same span (`getrusage`: user and system).
Run as `python -m bench.smtp_postfix_client --client own|aiosmtplib --port P ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiosmtplib
import uvloop

from leasebox.delivery.providers.base import Email, derived_message_id
from leasebox.delivery.providers.mime import build_mime
from leasebox.delivery.providers.smtp import SmtpProvider, SmtpSettings, wire_address

SENDER = "no-reply@example.com"
CLIENTS = ("own", "aiosmtplib")

Send = Callable[[Email], Awaitable[None]]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def emails(prefix: str, count: int) -> list[Email]:
    return [
        Email(
            outbox_id=n,
            kind="otp",
            aggregate_id=f"user-{n}",
            delivery_key=f"{prefix}{n}",
            recipient=f"user{n % 1000}@example.com",
            subject="Your verification code",
            text=f"Your code is {n % 1_000_000:06d}. It is valid for 10 minutes.\n",
            html=f"<p>Your code is <strong>{n % 1_000_000:06d}</strong>.</p>",
            attempt=1,
        )
        for n in range(count)
    ]


async def _drive(send: Send, items: list[Email], concurrency: int) -> int:
    """Keep `concurrency` sends in flight until `items` are done; the number that failed."""
    queue = iter(items)
    failed = 0

    async def lane() -> None:
        nonlocal failed
        for item in queue:
            try:
                await send(item)
            except Exception:
                failed += 1

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return failed


async def _own(
    port: int, tls: bool, concurrency: int
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    settings = SmtpSettings(
        host="127.0.0.1",
        port=port,
        starttls=tls,
        sender=SENDER,
        timeout=30.0,
        pool_size=concurrency,
    )
    provider = SmtpProvider(settings)
    await provider.start()

    async def send(email: Email) -> None:
        await provider.send(email)

    return send, provider.close


async def _aiosmtplib(
    port: int, tls: bool, concurrency: int
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    idle: list[aiosmtplib.SMTP] = []
    for _ in range(concurrency):
        client = aiosmtplib.SMTP(
            hostname="127.0.0.1", port=port, start_tls=tls, validate_certs=True, timeout=30.0
        )
        await client.connect()
        idle.append(client)

    async def send(email: Email) -> None:
        recipient = wire_address(email.recipient)
        message_id = derived_message_id(email.delivery_key, "example.com")
        message = build_mime(email, SENDER, recipient=recipient, message_id=message_id)
        client = idle.pop()
        try:
            await client.sendmail(SENDER, [recipient], message)
        finally:
            idle.append(client)

    async def close() -> None:
        for client in idle:
            await client.quit()

    return send, close


async def run(args: argparse.Namespace) -> dict[str, Any]:
    opened = _own if args.client == "own" else _aiosmtplib
    send, close = await opened(args.port, args.tls, args.concurrency)
    try:
        warm = await _drive(send, emails(f"{args.prefix}w", args.concurrency), args.concurrency)
        items = emails(args.prefix, args.messages)
        cpu_before, start = _cpu(), time.perf_counter()
        failed = await _drive(send, items, args.concurrency)
        seconds, cpu = time.perf_counter() - start, _cpu() - cpu_before
    finally:
        await close()
    return {
        "client": args.client,
        "messages": args.messages,
        "warm_up": args.concurrency,
        "failed": failed + warm,
        "seconds": seconds,
        "cpu_seconds": cpu,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.smtp_postfix_client", description=__doc__
    )
    parser.add_argument("--client", choices=CLIENTS, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--prefix", required=True, help="the delivery keys' prefix")
    parser.add_argument("--tls", action="store_true", help="STARTTLS (the CA from SSL_CERT_FILE)")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        print(json.dumps(runner.run(run(args))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
