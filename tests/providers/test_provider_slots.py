"""A provider's connection slots (`leasebox.delivery.providers.base.Slots`): taken in the order
asked for, each wait bounded by the timeout, none lost to a cancelled wait."""

from __future__ import annotations

import asyncio

import pytest

from leasebox.delivery.providers.base import Slots
from leasebox.errors import TransientProviderError


async def test_free_slots_are_taken_at_once_and_released_ones_serve_waiters_in_order() -> None:
    slots = Slots(2, 5.0, "SMTP server smtp://mail:25")
    await slots.acquire()
    await slots.acquire()
    assert slots.locked()
    served: list[str] = []

    async def wait(name: str) -> None:
        await slots.acquire()
        served.append(name)

    waiting = [asyncio.create_task(wait(name)) for name in ("first", "second", "third")]
    await asyncio.sleep(0)
    slots.release()
    slots.release()
    await asyncio.sleep(0)

    assert served == ["first", "second"]
    slots.release()
    await asyncio.gather(*waiting)
    assert served == ["first", "second", "third"]


async def test_every_wait_ends_at_its_own_deadline_as_a_pool_timeout() -> None:
    slots = Slots(1, 0.1, "SMTP server smtp://mail:25")
    await slots.acquire()
    loop = asyncio.get_running_loop()
    began = loop.time()
    first = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0.05)
    second = asyncio.create_task(slots.acquire())

    done, _ = await asyncio.wait([first, second], timeout=2.0)

    assert done == {first, second}
    for task in (first, second):
        error = task.exception()
        assert isinstance(error, TransientProviderError)
        assert error.code == "pool_timeout"
        assert "no connection to SMTP server smtp://mail:25 came free within 0.1s" in str(error)
    assert loop.time() - began < 1.0


async def test_a_slot_handed_to_a_wait_cancelled_meanwhile_is_given_back() -> None:
    slots = Slots(1, 5.0, "SMTP server smtp://mail:25")
    await slots.acquire()
    cancelled = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)

    slots.release()  # handed to the waiter, which is cancelled before it runs again
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled

    assert not slots.locked()


async def test_a_cancelled_wait_takes_no_slot_from_the_waits_behind_it() -> None:
    slots = Slots(1, 5.0, "SMTP server smtp://mail:25")
    await slots.acquire()
    cancelled = asyncio.create_task(slots.acquire())
    behind = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)

    slots.release()

    await asyncio.wait_for(behind, 2.0)
    assert cancelled.cancelled()
    assert slots.locked()
