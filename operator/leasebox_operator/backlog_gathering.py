"""Backlog reads of many pools gathered into one query per database, schema and window.

Hundreds of pools usually share one database, and each polls its backlog every few seconds:
at 500 pools that is a hundred queries a second, and the operator's fixed cost of a query
(a pooled connection, the round trip, the result) was the largest part of a poll. The
backlog query reads any set of kinds in one statement, so the reads that arrive within a
short gathering window (`LEASEBOX_OPERATOR_BACKLOG_GATHER`, 0.1 s by default) for the same
database, schema and rate window go out as one query for all their kinds, and each pool
takes its own kinds from the answer. Every pool's figures are the database's at one
instant, as before; a poll waits at most the window longer. A failed query fails every
read it gathered, each with an error of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from leasebox.store.backlog import Backlog
from leasebox_operator.errors import PollError

# (DSN, schema, rate window): the reads one query can answer together.
Key = tuple[str, str, float]
Read = Callable[[str, list[str], str, float], Awaitable[Backlog]]


@dataclass
class _Gathering:
    """The reads waiting for one key's next query."""

    timer: asyncio.TimerHandle | None = None
    kinds: dict[str, None] = field(default_factory=dict)  # in order, without repeats
    waiters: list[asyncio.Future[Backlog]] = field(default_factory=list)


class BacklogGatherer:
    """Runs `read` once per gathering window and key, for the kinds of every waiting poll.

    With a window of 0 every read is its own query, as without a gatherer.
    """

    def __init__(self, read: Read, window_seconds: float) -> None:
        if window_seconds < 0:
            raise ValueError("the gathering window must be >= 0")
        self._read = read
        self.window_seconds = window_seconds
        self._open: dict[Key, _Gathering] = {}
        self._queries: set[asyncio.Task[None]] = set()

    async def backlog(
        self, dsn: str, kinds: Sequence[str], schema: str, window_seconds: float
    ) -> Backlog:
        """The backlog of `kinds`, read with the other reads of this gathering window."""
        if self.window_seconds == 0:
            return await self._read(dsn, list(kinds), schema, window_seconds)
        loop = asyncio.get_running_loop()
        key = (dsn, schema, window_seconds)
        gathering = self._open.get(key)
        if gathering is None:
            gathering = self._open[key] = _Gathering()
            gathering.timer = loop.call_later(self.window_seconds, self._start, key)
        gathering.kinds.update(dict.fromkeys(kinds))
        waiter: asyncio.Future[Backlog] = loop.create_future()
        gathering.waiters.append(waiter)
        return (await waiter).of_kinds(kinds)

    def _start(self, key: Key) -> None:
        gathering = self._open.pop(key)
        query = asyncio.ensure_future(self._query(key, gathering))
        self._queries.add(query)
        query.add_done_callback(self._queries.discard)

    async def _query(self, key: Key, gathering: _Gathering) -> None:
        waiting = [w for w in gathering.waiters if not w.done()]  # a stopped poll left
        if not waiting:
            return
        dsn, schema, window = key
        try:
            backlog = await self._read(dsn, list(gathering.kinds), schema, window)
        except asyncio.CancelledError:
            for waiter in waiting:
                waiter.cancel()
            raise
        except Exception as exc:  # a PollError, or a fault each poll logs as it did alone
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_exception(_own_copy(exc))
            return
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(backlog)

    async def close(self) -> None:
        """Cancel the reads not yet answered (the operator is stopping)."""
        open_, self._open = list(self._open.values()), {}
        for gathering in open_:
            if gathering.timer is not None:
                gathering.timer.cancel()
            for waiter in gathering.waiters:
                waiter.cancel()
        queries = list(self._queries)
        for query in queries:
            query.cancel()
        await asyncio.gather(*queries, return_exceptions=True)


def _own_copy(exc: Exception) -> Exception:
    """A PollError for one waiter (a raised exception carries its own traceback)."""
    return PollError(exc.message, exc.reason) if isinstance(exc, PollError) else exc
