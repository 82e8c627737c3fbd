"""One way to run a scripted asyncio server on loopback for a test: on a thread of its own.

A synchronous test, a worker process and a test's own event loop (asyncio's or uvloop) all
talk to these servers, so each one runs on its own thread with its own event loop. The
listener binds port 0, so the kernel picks a free port and the server holds it from that
moment (no probe that another process could race). The test gets the server only once its
listener is serving, so the first connection is accepted. Stopping lets the server wind
down (sessions end or are closed), gives the closed transports their `connection_lost`,
and only then closes the loop; a server that does not start or stop in time is an error,
never a hang.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

START_SECONDS = 10.0
STOP_SECONDS = 10.0
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Running:
    """Where the server listens, and the loop it runs on (for `call_soon_threadsafe`)."""

    port: int
    loop: asyncio.AbstractEventLoop


SESSIONS_END_SECONDS = 5.0


async def other_tasks_end() -> None:
    """Wait a little for every task of the loop but this one: the sessions still open."""
    sessions = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if sessions:
        await asyncio.wait(sessions, timeout=SESSIONS_END_SECONDS)


@contextmanager
def serve_in_thread(
    name: str,
    listen: Callable[[], Awaitable[asyncio.Server]],
    wind_down: Callable[[], Awaitable[None]] | None = None,
) -> Iterator[Running]:
    """Run `listen()`'s server on a new thread and loop for the body of the block.

    `listen` runs on the server's loop and returns a listener bound to port 0 on loopback;
    `wind_down`, if given, runs there once the test is done, before the listener closes.
    """
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    failures: list[BaseException] = []
    port = 0

    async def main() -> None:
        nonlocal port
        try:
            listener = await listen()
        except Exception as exc:  # handed to the test's thread, which raises it
            failures.append(exc)
            started.set()
            return
        port = int(listener.sockets[0].getsockname()[1])
        started.set()
        async with listener:
            await stop.wait()
            if wind_down is not None:
                await wind_down()
        for _ in range(5):  # let the closed transports run their connection_lost
            await asyncio.sleep(0)

    thread = threading.Thread(
        target=loop.run_until_complete, args=(main(),), name=name, daemon=True
    )
    thread.start()
    try:
        if not started.wait(START_SECONDS):
            raise RuntimeError(f"the {name} did not start in {START_SECONDS:.0f} s")
        if failures:
            raise RuntimeError(f"the {name} did not start") from failures[0]
        yield Running(port, loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(STOP_SECONDS)
        if thread.is_alive():
            raise RuntimeError(f"the {name} did not stop in {STOP_SECONDS:.0f} s")
        loop.close()
