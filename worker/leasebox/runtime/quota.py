"""A worker's share of its provider account's quota: tokens reserved in the database, waited for
here, before a message goes to the provider.

Every sender that holds a message asks the gate for a token (`take`). The gate reserves
tokens for all the senders waiting at once in one statement (`store.quotas.reserve_tokens`,
which orders the reservations of every worker of the account; its docstring says why the
account's rate holds), hands them out in order, and each sender sleeps until its token is
due. It reserves no further ahead than `horizon` seconds of the account's rate at a time, and
asks the worker to claim no more rows than that many tokens (`room`), so claimed messages do
not pile up in a worker waiting for tokens while a more urgent message waits in the queue.

Expiry wins: a message whose token is due after its `expires_at` is not kept waiting for it
(`take` says False and the worker dead-letters it `expired`, unsent).

A rate-limit reset from the provider (a 429 with Retry-After) pauses the whole account
(`pause`): the gate writes the pause to the account's row, which NOTIFYs the other workers
(`notice`), and every token due before the pause ends is void, its sender takes another.
A worker that does not LISTEN learns of a pause with its next reservation, at most `horizon`
seconds later.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from leasebox.db.connections import DATABASE_ERRORS, STATEMENT_TIMEOUT
from leasebox.store import quotas

log = logging.getLogger("leasebox.worker")

# How far ahead, in seconds of the account's rate, a worker reserves tokens at a time.
HORIZON_SECONDS = 0.5
# How long the best estimate of the database's clock is kept before a fresh one replaces it
# (the two clocks drift apart slowly, by NTP's steps on the database's host).
OFFSET_MEMORY = 60.0
# A token: when it is due on this process's monotonic clock, and on the database's.
Token = tuple[float, datetime]


class QuotaGate:
    """Tokens of one provider account for one worker process."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        account: str,
        rate: float,
        burst: int,
        schema: str,
        clock: Callable[[], datetime | None],
        on_room: Callable[[], None] = lambda: None,
        horizon: float = HORIZON_SECONDS,
    ) -> None:
        self.account = account
        self.rate = rate
        self.burst = burst
        self._pool = pool
        self._schema = schema
        self._clock = clock
        self._on_room = on_room
        self.batch = max(1, math.ceil(rate * horizon))
        self._horizon = horizon
        self._waiters: deque[asyncio.Future[Token]] = deque()
        self._spare: deque[Token] = deque()
        self._reserving: asyncio.Task[None] | None = None
        self._paused_until = -math.inf  # monotonic
        self._pause_changed = asyncio.Event()
        # The database's epoch seconds minus this process's monotonic clock: the largest of
        # the answers seen (an answer read late by a busy process makes it look smaller,
        # never larger), forgotten an `OFFSET_MEMORY` after it was seen.
        self._offset: float | None = None
        self._offset_seen = -math.inf
        self._writes: set[asyncio.Task[None]] = set()
        self.waiting = 0

    def room(self) -> int:
        """How many more messages the worker may claim for the senders: a reservation's worth
        less those already waiting for a token."""
        return max(0, self.batch - self.waiting)

    async def take(self, expires_at: datetime | None = None) -> bool:
        """Wait until a token is due; False (at once) when it would be due only after
        `expires_at`: the message must not wait past its expiry."""
        self.waiting += 1
        try:
            while True:
                due, due_db = await self._token()
                if expires_at is not None and due_db >= expires_at:
                    return False
                if await self._until(due):
                    return True
        finally:
            self.waiting -= 1
            self._on_room()

    def pause(self, seconds: float) -> None:
        """The provider asked the account to wait `seconds`: pause every worker of it."""
        self._paused(time.monotonic() + seconds)
        task = asyncio.get_running_loop().create_task(self._write_pause(seconds))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def notice(self, account: str, until_epoch: float) -> None:
        """Another worker paused `account` until `until_epoch` (the database's clock)."""
        if account != self.account:
            return
        if self._offset is None:
            self._paused(until_epoch - time.time() + time.monotonic())
        else:
            self._paused(until_epoch - self._offset)

    @property
    def paused(self) -> bool:
        return time.monotonic() < self._paused_until

    async def close(self) -> None:
        """Stop reserving; fail whoever still waits; finish writing pauses."""
        if self._reserving is not None:
            self._reserving.cancel()
        for waiter in self._waiters:
            waiter.cancel()
        self._waiters.clear()
        await asyncio.gather(*self._writes, return_exceptions=True)

    # -- inside ------------------------------------------------------------------------------

    async def _token(self) -> Token:
        while self._spare:
            token = self._spare.popleft()
            if token[0] >= self._paused_until:
                return token
        waiter: asyncio.Future[Token] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._reserving is None or self._reserving.done():
            self._reserving = asyncio.get_running_loop().create_task(self._reserve())
        return await waiter

    async def _until(self, due: float) -> bool:
        """Sleep until `due`; False if a pause that covers it arrived meanwhile."""
        while True:
            if due < self._paused_until:
                return False
            left = due - time.monotonic()
            if left <= 0:
                return True
            changed = self._pause_changed
            try:
                async with asyncio.timeout(left):
                    await changed.wait()
            except TimeoutError:
                continue

    async def _reserve(self) -> None:
        """Reserve tokens for the waiting senders, a batch at a time, until none waits."""
        while True:
            # No token is of use before a pause ends: reserve after it.
            paused = self._paused_until - time.monotonic()
            if paused > 0:
                await asyncio.sleep(paused)
                continue
            waiting = [w for w in self._waiters if not w.done()]
            self._waiters = deque(waiting)
            if not waiting:
                return
            count = min(len(waiting), self.batch)
            try:
                async with asyncio.timeout(STATEMENT_TIMEOUT), self._pool.connection() as conn:
                    reservation = await quotas.reserve_tokens(
                        conn,
                        account=self.account,
                        rate=self.rate,
                        burst=self.burst,
                        count=count,
                        schema=self._schema,
                        now=self._clock(),
                    )
            except (*DATABASE_ERRORS, TimeoutError) as exc:
                for waiter in self._waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                self._waiters.clear()
                return
            last = self._hand_out(reservation)
            # Reserve again once the last token is within the horizon: no sooner, so that
            # this worker holds no more than a horizon of the account's tokens.
            ahead = last - self._horizon - time.monotonic()
            if ahead > 0 and any(not w.done() for w in self._waiters):
                await asyncio.sleep(ahead)

    def _hand_out(self, reservation: quotas.Reservation) -> float:
        """Give the reservation's tokens to the senders in the order they asked; keep the
        ones whose sender left; the local time the last token is due."""
        local_now = time.monotonic()
        offset = reservation.now.timestamp() - local_now
        kept = self._offset
        if kept is None or offset > kept or local_now - self._offset_seen > OFFSET_MEMORY:
            kept = self._offset = offset
            self._offset_seen = local_now
        if reservation.paused_until is not None:
            self._paused(reservation.paused_until.timestamp() - kept)
        last = local_now
        for index in range(reservation.count):
            due_db = reservation.due(index)
            last = due_db.timestamp() - kept  # the database's moment on the monotonic clock
            token = (last, due_db)
            while self._waiters and self._waiters[0].done():
                self._waiters.popleft()
            if self._waiters:
                self._waiters.popleft().set_result(token)
            else:
                self._spare.append(token)
        return last

    def _paused(self, until: float) -> None:
        if until <= self._paused_until:
            return
        self._paused_until = until
        changed, self._pause_changed = self._pause_changed, asyncio.Event()
        changed.set()

    async def _write_pause(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(STATEMENT_TIMEOUT), self._pool.connection() as conn:
                await quotas.pause_quota(
                    conn,
                    account=self.account,
                    seconds=seconds,
                    schema=self._schema,
                    now=self._clock(),
                )
        except (*DATABASE_ERRORS, TimeoutError) as exc:
            log.warning(
                "could not share the provider's rate-limit pause with the other workers (%s)",
                type(exc).__name__,
                extra={"error_class": type(exc).__name__},
            )
        else:
            log.info(
                "the provider asked to slow down: account %s paused for %.1fs",
                self.account,
                seconds,
            )
