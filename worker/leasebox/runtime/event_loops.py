"""The worker's event loop: uvloop where it is installed, asyncio's own loop otherwise.

Between sends a worker's CPU goes to its event loop: an SMTP transaction without PIPELINING
is four round trips, each a wake-up, a read and a write, and every database statement is
another. uvloop runs that loop in C (libuv) for less CPU per message (in `make bench`, about
7 % less for SMTP and 5 % for the no-op drain) and changes nothing about what the worker
does, so `auto`, the default, takes it whenever it imports.

- `auto`: uvloop if it imports, else asyncio's loop (no warning: platforms without uvloop,
  such as Windows, are supported);
- `asyncio`: always the standard loop, to rule the loop out while chasing a problem;
- `uvloop`: insist; without it the worker stops with a configuration error instead of
  quietly running on the other loop.

The names of the choices and the reader of the setting are in `leasebox.config`, with every
other setting; this module makes and runs the loop. The loop is chosen before the worker's
coroutine exists, so a refused choice leaves no coroutine that was never awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from leasebox.config import ASYNCIO, UVLOOP
from leasebox.errors import ConfigurationError

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(choice: str) -> LoopFactory:
    """What makes a loop of `choice` (`running_loop_name` says which one runs)."""
    if choice == ASYNCIO:
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == UVLOOP:
            raise ConfigurationError(
                "the uvloop event loop was asked for (--event-loop uvloop), but uvloop is not "
                "installed: install it (pip install uvloop) or choose auto or asyncio"
            ) from None
        return asyncio.new_event_loop
    factory: LoopFactory = uvloop.new_event_loop
    return factory


def run(main: Callable[[], Coroutine[Any, Any, T]], choice: str) -> T:
    """`main()` to completion on a new loop of `choice` (closed afterwards, as
    `asyncio.run` closes its own)."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main())


def running_loop_name() -> str:
    """`uvloop` or `asyncio`: the loop this code runs on, for the worker's start-up log."""
    module = type(asyncio.get_running_loop()).__module__
    return UVLOOP if module.partition(".")[0] == UVLOOP else ASYNCIO
