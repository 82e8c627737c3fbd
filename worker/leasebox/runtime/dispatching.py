"""Handing claimed rows to the sender tasks, waking no more of them than the rows need.

A worker runs `concurrency` sender tasks, so that sends that wait on a provider overlap. A
claim hands them a batch of rows at once. `asyncio.Queue` wakes one waiting sender per row
put, so a batch of a hundred wakes every idle sender; with a provider that answers without
waiting (`null://`, a provider that batches on its own), the first sender sends the whole
batch before the others run, and each of them wakes to find nothing, which costs more than
the sends. Here a batch wakes one sender, and a sender that takes a row wakes the next idle
one only when rows remain and no woken sender is still on its way. With a provider that
waits, the chain wakes every sender within one pass of the event loop (each wakes the next
as it starts); with one that does not, the batch is sent by one task and one wake-up.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadyRows(Generic[T]):
    """A FIFO of rows for sender tasks: `add` rows, `take` one (waiting if there are none).

    `close()` wakes every waiting sender; `take` then returns None once no row is left.
    """

    def __init__(self) -> None:
        self._rows: deque[T] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        self._closed = False

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, rows: Iterable[T]) -> None:
        self._rows.extend(rows)
        if self._rows:
            self._wake_one()

    def take_nowait(self) -> T | None:
        """A row at once, or None when there is none (the sender then awaits `take`)."""
        rows = self._rows
        if not rows:
            return None
        row = rows.popleft()
        if rows:
            self._wake_one()
        return row

    async def take(self) -> T | None:
        """The next row, waiting for one; None once closed and empty."""
        while not self._rows:
            if self._closed:
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            try:
                await waiter
            finally:
                if waiter.done() and not waiter.cancelled():
                    self._waking -= 1
        return self.take_nowait()

    def drain(self) -> list[T]:
        """Every row not taken yet, removed."""
        rows = list(self._rows)
        self._rows.clear()
        return rows

    def close(self) -> None:
        """No more rows will come: wake every waiting sender so that it can return."""
        self._closed = True
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                self._waking += 1
                waiter.set_result(None)

    def _wake_one(self) -> None:
        if self._waking:
            return  # a sender is on its way; it wakes the next if rows remain
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                self._waking += 1
                waiter.set_result(None)
                return
