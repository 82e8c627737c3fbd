"""Pools' backlog reads of one gathering window go out as one query; each gets its kinds."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from leasebox.store.backlog import Backlog, KindBacklog
from leasebox_operator.backlog_gathering import BacklogGatherer
from leasebox_operator.errors import PollError

AT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _kind(kind: str, pending: int) -> KindBacklog:
    return KindBacklog(kind, pending, pending, 0, 0, 0, None, None, 0)


class Database:
    """Answers every kind with a pending count of its name's length; records each query."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.queries: list[tuple[str, tuple[str, ...], str, float]] = []
        self.fail = fail

    async def read(self, dsn: str, kinds: list[str], schema: str, window: float) -> Backlog:
        self.queries.append((dsn, tuple(kinds), schema, window))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return Backlog(tuple(_kind(k, len(k)) for k in sorted(kinds)), AT, window)


def _pending(backlog: Backlog) -> dict[str, int]:
    return {k.kind: k.pending for k in backlog.kinds}


async def _read_all(
    gatherer: BacklogGatherer, reads: Sequence[tuple[str, list[str], str, float]]
) -> list[Backlog]:
    return list(await asyncio.gather(*(gatherer.backlog(*read) for read in reads)))


async def test_reads_of_one_window_are_one_query_and_each_pool_gets_only_its_kinds() -> None:
    database = Database()
    gatherer = BacklogGatherer(database.read, 0.01)
    first, second, third = await _read_all(
        gatherer,
        [
            ("db", ["otp"], "leasebox", 15.0),
            ("db", ["invite", "otp"], "leasebox", 15.0),
            ("db", ["reset"], "leasebox", 15.0),
        ],
    )
    assert database.queries == [("db", ("otp", "invite", "reset"), "leasebox", 15.0)]
    assert _pending(first) == {"otp": 3}
    assert _pending(second) == {"invite": 6, "otp": 3}
    assert _pending(third) == {"reset": 5}
    assert first.observed_at == second.observed_at == third.observed_at


async def test_another_database_schema_or_rate_window_is_a_query_of_its_own() -> None:
    database = Database()
    gatherer = BacklogGatherer(database.read, 0.01)
    await _read_all(
        gatherer,
        [
            ("db", ["otp"], "leasebox", 15.0),
            ("other-db", ["otp"], "leasebox", 15.0),
            ("db", ["otp"], "tenant_b", 15.0),
            ("db", ["otp"], "leasebox", 60.0),
        ],
    )
    assert len(database.queries) == 4


async def test_a_read_after_the_window_closed_waits_for_the_next_query() -> None:
    database = Database()
    gatherer = BacklogGatherer(database.read, 0.01)
    await gatherer.backlog("db", ["otp"], "leasebox", 15.0)
    await gatherer.backlog("db", ["otp"], "leasebox", 15.0)
    assert len(database.queries) == 2


async def test_a_window_of_zero_reads_every_backlog_alone() -> None:
    database = Database()
    gatherer = BacklogGatherer(database.read, 0)
    await _read_all(gatherer, [("db", ["otp"], "leasebox", 15.0)] * 3)
    assert len(database.queries) == 3


async def test_a_failed_query_fails_every_read_it_gathered_each_with_its_own_error() -> None:
    database = Database(fail=PollError("no database connection within 5s", "ConnectionFailed"))
    gatherer = BacklogGatherer(database.read, 0.01)
    reads = [gatherer.backlog("db", [kind], "leasebox", 15.0) for kind in ("otp", "invite")]
    errors = await asyncio.gather(*reads, return_exceptions=True)
    assert len(database.queries) == 1
    assert all(isinstance(e, PollError) and e.reason == "ConnectionFailed" for e in errors)
    assert errors[0] is not errors[1]


async def test_a_stopped_poll_does_not_stop_the_others_reads() -> None:
    database = Database()
    gatherer = BacklogGatherer(database.read, 0.01)
    stopped = asyncio.ensure_future(gatherer.backlog("db", ["invite"], "leasebox", 15.0))
    kept = asyncio.ensure_future(gatherer.backlog("db", ["otp"], "leasebox", 15.0))
    await asyncio.sleep(0)
    stopped.cancel()
    assert _pending(await kept) == {"otp": 3}
    assert stopped.cancelled()


async def test_closing_cancels_the_reads_still_waiting() -> None:
    database = Database()
    gatherer = BacklogGatherer(database.read, 30.0)
    waiting = asyncio.ensure_future(gatherer.backlog("db", ["otp"], "leasebox", 15.0))
    await asyncio.sleep(0)
    await gatherer.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert database.queries == []


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        BacklogGatherer(Database().read, -1)
