"""The worker runtime: claim under a lease, send with bounded concurrency, settle, repeat.

One asyncio task claims: whenever fewer than `capacity` rows are held unsent it claims up to
a batch in one committed statement and hands the rows to `concurrency` sender tasks
(`dispatching`). A row whose outcome is known waits only for its settling statement, so it
does not count, up to a batch of them: the next batch is claimed while the last is settled.
When a claim comes back short, the queue is drained, and the claimer waits for a NOTIFY or
the poll interval. Senders render, send, and hand the outcome to the `CompletionBatcher`,
which settles rows in batches conditional on their lease tokens. A claim settles the rows
whose address is on the suppression list itself (`suppressed`, counted here); a provider
that refuses an address as one it suppresses ends the message `suppressed` too. Beside them
run a lease keeper (extends leases past half their time), a sweeper (reclaims other workers'
expired leases, dead-letters expired OTPs) and a NOTIFY listener.

Stopping (SIGTERM): the claimer stops; rows still queued are released at once for other
workers; running sends get `grace_seconds` to finish, after which they are cancelled and
released too; the outcomes are written; then `run` returns.

Time: `clock()` gives the `now` passed to SQL (None = the database's clock); tests inject a
datetime so that leases, backoff and expiry move without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasebox.db.connections import DATABASE_ERRORS, STATEMENT_TIMEOUT
from leasebox.delivery.boundary import Accepted, send_once
from leasebox.delivery.providers.base import (
    Email,
    Provider,
    RequestOutcome,
    idempotency,
    new_email,
    reads_content,
)
from leasebox.delivery.rendering import RenderedEmail
from leasebox.delivery.retrying import (
    AMBIGUOUS_CODE,
    EXPIRED_CODE,
    MISSING_MESSAGE_CODE,
    TIMEOUT_CODE,
    Failure,
    classify,
    retry_delay,
    should_retry,
)
from leasebox.errors import PERMANENT, TRANSIENT, AmbiguousProviderError, MissingPayloadKeys
from leasebox.producer.payload_crypto import KEYS_VARIABLE, PayloadCipher, default_cipher
from leasebox.runtime import leases, upkeep
from leasebox.runtime.completion import Completion, CompletionBatcher
from leasebox.runtime.dispatching import ReadyRows
from leasebox.runtime.event_loops import running_loop_name
from leasebox.runtime.leases import Held
from leasebox.runtime.logs import message_fields
from leasebox.runtime.metrics import WorkerMetrics
from leasebox.runtime.quota import QuotaGate
from leasebox.runtime.settings import AGED_SHARE, WorkerSettings
from leasebox.runtime.tracing import DeliveryTracing
from leasebox.states import DeadReason
from leasebox.store import claiming
from leasebox.store.claiming import Claimed, ClaimedMessage, Cursor
from leasebox.store.settling import (
    Dead,
    Release,
    Retry,
    Sent,
    Settlement,
    Superseded,
    Suppressed,
)
from leasebox.store.suppressions import DAY

log = logging.getLogger("leasebox.worker")

_DB_RETRY_MAX = 5.0
# The `leasebox_not_ready` cause of a worker that met encrypted secrets without keys.
KEYS = "payload_keys"
_KIND = attrgetter("kind")
_INDEX_ORDER = attrgetter("available_at", "id")
# A claim that reads on from a cursor misses a row committed late by a transaction that began
# before the rows the cursor passed, so now and then one reads from the start: after this many
# claims, and no sooner than `RESCAN_SECONDS` (or the poll interval, if shorter) after the
# last. A read from the start walks the index entries of every row claimed since the last
# vacuum, so a draining worker that read from the start every few claims spent more on it the
# longer the backlog (a million-row drain lost a sixth of its rate); once a second, a row
# committed behind the cursor waits no longer than a polling worker would take to see it.
RESCAN_EVERY = 16
RESCAN_SECONDS = 1.0
# What a provider that reads no content (`null://`) gets for every message.
_NO_CONTENT = RenderedEmail(subject="", text="", html=None)
_MISSING_MESSAGE = Failure(
    PERMANENT, MISSING_MESSAGE_CODE, "its message is missing from the outbox: nothing to send"
)
# A send cancelled by a stop after the provider's last check before writing the message.
_CUT_SHORT = classify(
    AmbiguousProviderError(
        "the send was cut short by a stop after the message was handed to the provider: it "
        "may have been accepted"
    )
)
_THROTTLED = RequestOutcome.THROTTLED.value
_UNCHECKED = Failure(
    TRANSIENT,
    "supersession_check",
    "could not check for a newer message of its replacement key: not sent",
)


class Renderer(Protocol):
    """What the worker needs of `leasebox.delivery.rendering.TemplateRenderer`."""

    def render(
        self, template: str, data: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> RenderedEmail: ...


def database_clock() -> datetime | None:
    """The production clock: None, so every statement uses the database's `now()`."""
    return None


class Worker:
    """One worker process's runtime; `run()` returns after a stop or, with `drain`, when idle."""

    def __init__(
        self,
        settings: WorkerSettings,
        pool: AsyncConnectionPool,
        provider: Provider,
        renderer: Renderer,
        *,
        dsn: str | None = None,
        cipher: PayloadCipher | None = None,
        metrics: WorkerMetrics | None = None,
        clock: Callable[[], datetime | None] = database_clock,
        rng: Callable[[], float] = random.random,
        tracing: DeliveryTracing | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or WorkerMetrics()
        self.metrics.start_series(settings.kinds)
        self.metrics.start_provider(provider.name, idempotency(provider))
        self._pool = pool
        self._provider = provider
        self._renderer = renderer
        self._reads_content = reads_content(provider)
        # Spans of each delivery (None: off); they need the message's stored trace context,
        # which the claim reads with the content.
        self._tracing = tracing
        self._claims_content = self._reads_content or tracing is not None
        self._provider_name = provider.name
        self._dsn = dsn
        self._cipher = cipher or default_cipher()
        self._clock = clock
        self._rng = rng
        self._held: dict[int, Held] = {}
        # Where each kind's last full claim ended, how many claims read on from there, and
        # when a claim last read from the start.
        self._cursors: dict[str, Cursor] = {}
        self._cursor_claims = 0
        self._read_from_start_at = -math.inf
        # Kinds' priorities in the claim, and the rows of claims owed to messages past their
        # kind's aging (a share of every claim; see `AGED_SHARE`).
        self._priority = settings.priority_of
        self._aging = settings.aging_of
        self._prioritised = any(self._priority.values())
        self._aged_credit = 0.0
        # Held rows whose outcome the batcher has and has not written yet.
        self._settling = 0
        self._ready: ReadyRows[Held] = ReadyRows()
        self._room = asyncio.Event()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        # The sweeper's and a drain's sweeps run one at a time: a sweep skips the rows another
        # has locked, so a drain that swept beside an uncommitted sweep would find nothing
        # and exit, leaving the rows that sweep takes back unsent.
        self._sweeping = asyncio.Lock()
        self._completions = CompletionBatcher(
            pool,
            self.metrics,
            schema=settings.schema,
            clock=clock,
            on_settled=self._settled,
            lease_deadline=self._lease_deadline,
            statement_timeout=STATEMENT_TIMEOUT,
            worker_id=settings.worker_id,
            in_flight=lambda: self.metrics.sending,
        )
        self.quota: QuotaGate | None = None
        if settings.quota_rate is not None and settings.quota_account is not None:
            self.quota = QuotaGate(
                pool,
                account=settings.quota_account,
                rate=settings.quota_rate,
                burst=settings.burst,
                schema=settings.schema,
                clock=clock,
                on_room=self._room.set,
            )
        self.database_problem: str | None = None
        # Why the worker cannot do its job on its own account, by cause (`NOT_READY_CAUSES`):
        # `/readyz` says so and `leasebox_not_ready` shows it.
        self._blocked: dict[str, str] = {}
        self.notes: list[str] = []
        self.failed = False
        # How often the claim and the lease check have run: the positive signal that the
        # worker looked (at the clock, at its leases), for tests and for debugging.
        self.rounds: Counter[str] = Counter()

    # -- control -----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin a graceful stop; a second request skips what is left of the grace period."""
        if self._stop.is_set():
            self._hurry.set()
            return
        log.info("stopping: no new claims, finishing sends in flight")
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def secrets_mode(self) -> str:
        """How this worker handles message secrets (encrypted, plaintext allowed, no keys)."""
        return self._cipher.mode

    def status_lines(self) -> list[str]:
        """What `/readyz` says under its verdict: how this worker runs, and `notes` (a schema
        newer than this worker, say)."""
        return [f"secrets: {self.secrets_mode}", *self.notes]

    @property
    def completions(self) -> CompletionBatcher:
        """The outcomes waiting to be written, and how writing them has gone."""
        return self._completions

    @property
    def held(self) -> int:
        """Rows claimed and not yet settled."""
        return len(self._held)

    def block(self, cause: str, reason: str) -> None:
        """Not ready for `cause` (one of `NOT_READY_CAUSES`) until `unblock(cause)`."""
        self._blocked[cause] = reason
        self.metrics.not_ready.labels(cause).set(1)

    def unblock(self, cause: str) -> None:
        self._blocked.pop(cause, None)
        self.metrics.not_ready.labels(cause).set(0)

    async def until_stopped(self, seconds: float) -> bool:
        """Wait `seconds` or until a stop is requested; whether one was."""
        await self._until(self._stop, seconds)
        return self._stop.is_set()

    async def readiness_problem(self) -> str | None:
        """None when the worker can work, the database answers and the provider is healthy,
        else why not."""
        if self._blocked:
            return "; ".join(self._blocked.values())
        try:
            async with asyncio.timeout(3.0), self._pool.connection() as conn:
                await conn.execute("SELECT 1")
        except (*DATABASE_ERRORS, psycopg.Error) as exc:
            return f"database unreachable ({type(exc).__name__})"
        try:
            async with asyncio.timeout(5.0):
                problem = await self._provider.check()
        except TimeoutError:
            return "provider check timed out"
        return f"provider: {problem}" if problem else None

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Claim and send until stopped (or drained), then settle and return."""
        s = self.settings
        log.info(
            "worker started",
            extra={
                "worker_id": s.worker_id,
                "kinds": ",".join(s.kinds),
                "concurrency": s.concurrency,
                "lease_seconds": s.lease_seconds,
                "retention_seconds": s.retention_seconds,
                "provider": self._provider.name,
                "secrets": self.secrets_mode,
                "event_loop": running_loop_name(),
            },
        )
        if not self._cipher.encrypts:
            log.warning("secrets are not encrypted: %s", self.secrets_mode)
        flusher = self._spawn(self._completions.run(), "completions")
        senders = [self._spawn(self._send_loop(), "sender") for _ in range(s.concurrency)]
        helpers = [
            self._spawn(self._lease_keeper(), "lease keeper"),
            self._spawn(self._sweeper(), "sweeper"),
        ]
        if self._dsn:
            days = upkeep.keep_days(self._dsn, s.schema, s.retention_seconds)
            helpers.append(self._spawn(days, "partitions"))
        if s.listen and self._dsn:
            helpers.append(self._spawn(self._listener(self._dsn), "listener"))
        if self.quota is not None:
            log.info(
                "sending under a quota of %g/s (burst %d) shared by account %s",
                self.quota.rate,
                self.quota.burst,
                self.quota.account,
            )
        try:
            await self._claim_loop()
        finally:
            await self._shut_down(senders, helpers, flusher)
        log.info("worker stopped", extra={"worker_id": s.worker_id})

    def _spawn(self, work: Awaitable[None], name: str) -> asyncio.Task[None]:
        async def supervised() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("internal error in the %s; stopping", name)
                self.failed = True
                self._stop.set()
                self._hurry.set()

        return asyncio.get_running_loop().create_task(supervised(), name=f"leasebox {name}")

    async def _shut_down(
        self,
        senders: list[asyncio.Task[None]],
        helpers: list[asyncio.Task[None]],
        flusher: asyncio.Task[None],
    ) -> None:
        self._stop.set()
        for held in self._ready.drain():
            self._complete(held, Release(held.lease))
        self._ready.close()
        grace = self.settings.grace_seconds
        if any(not t.done() for t in senders):
            # All senders done, or a second stop request, or the grace period over.
            finished = asyncio.ensure_future(asyncio.wait(senders))
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                [finished, hurry], timeout=grace, return_when=asyncio.FIRST_COMPLETED
            )
            finished.cancel()
            hurry.cancel()
        late = [t for t in senders if not t.done()]
        if late:
            log.warning("grace period over: %d sends cancelled, rows released", len(late))
        for task in late:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if self.quota is not None:
            await self.quota.close()
        if self._completions.pending:
            log.info(
                "recording %d outcomes before exiting",
                self._completions.pending,
                extra={"worker_id": self.settings.worker_id},
            )
        await self._completions.close()
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
        if self._tracing is not None:
            self._tracing.close()

    # -- claiming ----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        s = self.settings
        failures = 0
        swept = False  # drain mode: swept since the last claim that found rows
        backlog = False  # the last claim came back full: more rows are likely ready
        # While a backlog lasts, claim at least half a batch at a time: a claim costs a round
        # trip and a statement, and claiming whatever a few settled rows freed would pay that
        # for a handful of rows. Half a batch still leaves the senders a full queue.
        reserved = s.batch_size if self.quota is None else min(s.batch_size, self.quota.batch)
        least = max(1, reserved // 2)
        while not self._stop.is_set():
            if KEYS in self._blocked:
                # Every message with encrypted secrets would be given back: claim nothing.
                if s.drain:
                    self.failed = True
                    return
                await self._until(self._stop, None)
                continue
            # Rows whose outcome is known wait only for its statement: they hold no send slot,
            # so the next batch is claimed while the last one is settled, up to a batch more.
            held = len(self._held)
            room = min(s.capacity - held + self._settling, s.capacity + s.batch_size - held)
            if self.quota is not None:
                # Under a quota, claim no more than the tokens a reservation brings: the
                # rest waits in the queue, where a more urgent message can pass it.
                room = min(room, self.quota.room() - len(self._ready))
            if room <= 0 or (backlog and room < least and self._held):
                self._room.clear()
                await self._until(self._room, None)
                continue
            self._wake.clear()
            try:
                claimed = await self._claim(min(room, s.batch_size))
            except DATABASE_ERRORS as exc:
                failures += 1
                delay = min(_DB_RETRY_MAX, s.poll_interval * failures)
                self._database_failed("claim", exc, failures)
                await self._until(self._stop, delay)
                continue
            if failures:
                log.info("database reachable again", extra={"worker_id": s.worker_id})
                failures = 0
            swept = swept and not claimed.chosen
            self.database_problem = None
            backlog = claimed.chosen == min(room, s.batch_size)
            if backlog:
                continue
            if s.drain:
                if not self._held and not claimed:
                    if claimed.suppressed:
                        continue  # it took rows, and settled them: there may be more
                    if swept:
                        log.info("drained: nothing is ready", extra={"worker_id": s.worker_id})
                        return
                    # Take back what dead workers left, then look once more before leaving.
                    try:
                        await self.sweep()
                    except DATABASE_ERRORS as exc:
                        failures += 1
                        self._database_failed("sweep", exc, failures)
                        await self._until(self._stop, min(_DB_RETRY_MAX, s.poll_interval))
                        continue
                    swept = True
                    continue
                self._room.clear()
                await self._until(self._room, None)
                continue
            await self._until(self._wake, s.poll_interval)

    async def _claim(self, limit: int) -> Claimed:
        s = self.settings
        started = time.monotonic()
        # While full batches come back, each claim reads on from where the last one ended;
        # after a short one, and now and then (`RESCAN_EVERY`), it reads from the start.
        spacing = min(RESCAN_SECONDS, s.poll_interval)
        rescan = (
            self._cursor_claims >= RESCAN_EVERY and started - self._read_from_start_at >= spacing
        )
        after = None if rescan else self._cursors
        if not after:
            self._read_from_start_at = started
        aged_limit = 0
        if self._prioritised:
            self._aged_credit = min(limit, self._aged_credit + limit * AGED_SHARE)
            aged_limit = int(self._aged_credit)
            self._aged_credit -= aged_limit
        tracing = self._tracing
        claim_started = time.time_ns() if tracing is not None else 0
        async with asyncio.timeout(STATEMENT_TIMEOUT), self._pool.connection() as conn:
            rows = await claiming.claim(
                conn,
                kinds=s.kinds,
                limit=limit,
                lease_seconds=s.lease_seconds,
                worker_id=s.worker_id,
                schema=s.schema,
                now=self._clock(),
                content=self._claims_content,
                after=after,
                priorities=self._priority,
                aging=self._aging,
                aged_limit=aged_limit,
            )
        if tracing is not None and rows:
            tracing.claimed(rows, claim_started, time.time_ns())
        self.rounds["claim"] += 1
        chosen: list[ClaimedMessage] = rows
        if rows.suppressed:
            self._suppressed_at_claim(rows.suppressed)
            chosen = sorted([*rows, *rows.suppressed], key=_INDEX_ORDER)
        self._move_cursors(chosen, full=rows.chosen == limit, rescanned=after is None)
        if self._prioritised:
            # Senders take the urgent kinds first (a stable sort keeps each kind's order).
            rows.sort(key=lambda message: -self._priority[message.kind])
        deadline = started + s.lease_seconds
        if rows:
            helds = [Held(message, started, deadline) for message in rows]
            self._held.update(zip([message.id for message in rows], helds, strict=True))
            self._ready.add(helds)
            self.metrics.claimed_rows(map(_KIND, rows))
        return rows

    def _suppressed_at_claim(self, rows: list[ClaimedMessage]) -> None:
        """Count and log the messages the claim found suppressed (it settled them already)."""
        self.metrics.suppressed_rows(map(_KIND, rows))
        for message in rows:
            log.info(
                "suppressed: the address is on the suppression list (%s)",
                message.suppression,
                extra=message_fields(message),
            )

    def _move_cursors(self, rows: list[ClaimedMessage], *, full: bool, rescanned: bool) -> None:
        """Remember where each kind's claim ended, or forget it when the claim came back short
        (the next claim then reads from the start, as it does after `RESCAN_EVERY` claims)."""
        if not full:
            self._cursors = {}
            self._cursor_claims = 0
            return
        if rescanned:
            self._cursors = {}
            self._cursor_claims = 0
        self._cursor_claims += 1
        last = {message.kind: message for message in rows}  # the rows are in index order
        for kind, message in last.items():
            self._cursors[kind] = Cursor(message.available_at, message.id)

    async def _until(self, event: asyncio.Event, at_most: float | None) -> None:
        """Wait for `event` or a stop, at most `at_most` seconds (None: no limit)."""
        waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=at_most, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def _complete(self, held: Held, action: Settlement) -> None:
        """Hand a held row's completion to the batcher; its send slot is free from now on."""
        self._settling += 1
        if self._tracing is not None:
            self._tracing.settling(held.message.id, type(action).__name__.lower())
        self._completions.put(Completion(held.message, action))
        self._room.set()

    def _settled(self, outbox_id: int) -> None:
        if self._held.pop(outbox_id, None) is not None:
            self._settling -= 1
        if self._tracing is not None:
            self._tracing.settled(outbox_id)
        self._room.set()

    def _lease_deadline(self, outbox_id: int) -> float | None:
        held = self._held.get(outbox_id)
        return None if held is None else held.deadline

    def _database_failed(self, what: str, exc: BaseException, failures: int) -> None:
        self.database_problem = f"database unavailable ({type(exc).__name__})"
        if failures == 1 or failures % 20 == 0:
            log.warning(
                "%s failed: database unavailable, retrying",
                what,
                extra={"error_class": type(exc).__name__, "worker_id": self.settings.worker_id},
            )

    # -- sending -----------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        ready = self._ready
        while True:
            # A row already waiting is taken at once, without the coroutine of `take()`.
            held = ready.take_nowait() or await ready.take()
            if held is None:
                return
            await self._deliver(held)

    async def _deliver(self, held: Held) -> None:
        message = held.message
        if self._stop.is_set() or held.lost or time.monotonic() >= held.deadline:
            if not self._stop.is_set():
                log.warning("lease ran out before the send started", extra=message_fields(message))
            self._complete(held, Release(held.lease))
            return
        if message.expires_at is not None and self._expired(held):
            self._complete(
                held,
                Dead(held.lease, DeadReason.EXPIRED, "expired before it could be sent", "expired"),
            )
            return
        if self._reads_content and message.recipient is None:
            self._failed(held, _MISSING_MESSAGE)
            return
        tracing = self._tracing
        step_started = time.time_ns() if tracing is not None else 0
        try:
            email = self._prepare(held)
        except MissingPayloadKeys:
            self._keys_missing(held)
            return
        except Exception as exc:
            failure = classify(exc)
            if tracing is not None:
                tracing.rendered(message.id, step_started, failure.code)
            self._failed(held, failure)
            return
        if tracing is not None:
            tracing.rendered(message.id, step_started)
        if self.quota is not None and not await self._quota_token(held, self.quota):
            return
        if message.replacement_key is not None and await self._replaced(held):
            return
        if tracing is not None:
            step_started = time.time_ns()
        metrics = self.metrics
        metrics.sending += 1
        started = time.monotonic()
        try:
            result = await send_once(self._provider, email)
        except asyncio.CancelledError:
            # Cut short by a stop. Before the provider's last check nothing went out: the
            # attempt is given back. From then on the message may have reached the provider,
            # as when a connection is lost before the answer: the attempt counts.
            elapsed = time.monotonic() - started
            if held.handed_over:
                metrics.record_send(message.kind, self._provider_name, _CUT_SHORT.outcome, elapsed)
                self._failed(held, _CUT_SHORT)
            else:
                metrics.record_send(message.kind, self._provider_name, None, elapsed)
                self._complete(held, Release(held.lease))
            raise
        finally:
            metrics.sending -= 1
        elapsed = time.monotonic() - started
        if tracing is not None:
            if isinstance(result, Accepted):
                tracing.sent(
                    message.id, step_started, provider_message_id=result.provider_message_id
                )
            else:
                tracing.sent(message.id, step_started, failure=result.code)
        if isinstance(result, Accepted):
            metrics.record_send(message.kind, self._provider_name, result.outcome, elapsed)
            for warning in result.warnings:
                log.warning("accepted, but %s", warning, extra=message_fields(message))
            self._complete(held, Sent(held.lease, result.provider_message_id))
            return
        # A send stopped as expired or superseded before it reached the wire made no request.
        replaced = held.superseded_by
        made = None if result.code == EXPIRED_CODE or replaced is not None else result.outcome
        metrics.record_send(message.kind, self._provider_name, made, elapsed)
        if self.quota is not None and result.outcome == _THROTTLED:
            pause = result.retry_after or retry_delay(
                result, 1, base=self.settings.backoff_base, cap=self.settings.backoff_max
            )
            self.quota.pause(pause)
        if replaced is not None:
            self._complete(held, Superseded(held.lease, replaced))
            return
        self._failed(held, result)

    def _keys_missing(self, held: Held) -> None:
        """A message with encrypted secrets and no keys to open them: the worker's fault, not
        the message's. It is given back with its attempt, and the worker claims no more."""
        if KEYS not in self._blocked:
            log.error(
                "messages have encrypted secrets and %s is not set: giving them back and "
                "claiming nothing until the worker is restarted with the keys",
                KEYS_VARIABLE,
                extra=message_fields(held.message),
            )
            self.block(
                KEYS,
                f"payload keys: messages have encrypted secrets and {KEYS_VARIABLE} is not "
                "set; claiming nothing until the worker is restarted with the keys",
            )
        self._complete(held, Release(held.lease))

    async def _quota_token(self, held: Held, quota: QuotaGate) -> bool:
        """Wait for a token of the account's quota; False when the row was settled instead:
        released (the tokens could not be reserved) or dead-lettered `expired` (its token
        would come only after its expiry, so it does not wait for it)."""
        try:
            allowed = await quota.take(held.message.expires_at)
        except (*DATABASE_ERRORS, TimeoutError) as exc:
            self._database_failed("quota reservation", exc, 1)
            self._complete(held, Release(held.lease))
            return False
        if not allowed or self._expired(held):
            reason = "its quota token would come only after its expiry: not sent"
            self._complete(held, Dead(held.lease, DeadReason.EXPIRED, reason, "expired"))
            return False
        return True

    async def _replaced(self, held: Held) -> bool:
        """Whether the held message was settled unsent because a newer message of its key
        replaced it (or that could not be checked): the worker's own check before it hands
        the message to the provider, which checks again after its own waits."""
        try:
            newer = await self._newer(held)
        except DATABASE_ERRORS:
            self._failed(held, _UNCHECKED)
            return True
        if newer is None:
            return False
        self._complete(held, Superseded(held.lease, newer))
        return True

    async def _newer(self, held: Held) -> int | None:
        """The newer message of the held message's replacement key, if one has been
        committed (as the database says now); remembered on the held row."""
        async with asyncio.timeout(STATEMENT_TIMEOUT), self._pool.connection() as conn:
            schema = self.settings.schema
            newer = await claiming.newer_replacement(conn, held.message, schema=schema)
        if newer is not None:
            held.superseded_by = newer
        return newer

    async def _superseded(self, held: Held) -> bool:
        """The provider's check right before the wire (`Email.superseded`)."""
        return await self._newer(held) is not None

    def _expired(self, held: Held) -> bool:
        """Whether the row's `expires_at` has passed, on the database's clock: checked before
        the send, and by the provider after every wait, right before the message goes out."""
        expires_at = held.message.expires_at
        return expires_at is not None and expires_at <= self._db_now(held)

    def _provider_check(self, held: Held) -> bool:
        """`_expired` as the provider asks it, right before it writes the message: once it
        passes, the message may be on its way (`Held.handed_over`)."""
        expired = self._expired(held)
        held.handed_over = not expired
        return expired

    def _prepare(self, held: Held) -> Email:
        message = held.message
        if self._reads_content:
            secrets = self._cipher.open(message.secrets) if message.secrets else {}
            rendered = self._renderer.render(message.template or "", message.data or {}, secrets)
        else:
            rendered = _NO_CONTENT
        return new_email(
            message.id,
            message.kind,
            message.aggregate_id,
            message.delivery_key,
            message.recipient or "",
            rendered.subject,
            rendered.text,
            rendered.html,
            message.attempts,
            lambda: self._provider_check(held),
            None if message.replacement_key is None else lambda: self._superseded(held),
        )

    def _db_now(self, held: Held) -> datetime:
        """The database's time now: the injected clock, or the claim's timestamp plus the
        time elapsed here since (the database's clock is the one all workers share)."""
        injected = self._clock()
        if injected is not None:
            return injected
        elapsed = time.monotonic() - held.claimed_at
        return held.message.claimed_at + timedelta(seconds=elapsed)

    def _failed(self, held: Held, failure: Failure) -> None:
        message = held.message
        limit = message.max_attempts or self.settings.max_attempts
        action: Retry | Dead | Suppressed
        if failure.suppressed_by_provider:
            expiry = self.settings.feedback_provider_days * DAY
            action = Suppressed(held.lease, failure.detail, failure.code, expiry)
        elif should_retry(failure, message.attempts, limit):
            delay = retry_delay(
                failure,
                message.attempts,
                base=self.settings.backoff_base,
                cap=self.settings.backoff_max,
                rng=self._rng,
            )
            action = Retry(held.lease, delay, failure.detail, failure.code)
        elif failure.code == AMBIGUOUS_CODE or (failure.code == TIMEOUT_CODE and held.handed_over):
            # The last attempt may have reached the provider: the reason says so.
            detail = f"ambiguous, possibly delivered: {failure.detail}"
            action = Dead(held.lease, DeadReason.POSSIBLY_DELIVERED, detail, failure.code)
        elif failure.transient:
            action = Dead(held.lease, DeadReason.ATTEMPTS_EXHAUSTED, failure.detail, failure.code)
        else:
            action = Dead(held.lease, failure.dead_reason, failure.detail, failure.code)
        self._complete(held, action)

    # -- leases, sweeps and wake-ups ---------------------------------------------------------

    async def _lease_keeper(self) -> None:
        while True:
            await asyncio.sleep(self.settings.extend_interval)
            try:
                await leases.extend_due_leases(self._pool, self._held, self.settings, self._clock())
            except DATABASE_ERRORS as exc:
                self._database_failed("lease extension", exc, 1)
            self.rounds["lease check"] += 1

    async def _sweeper(self) -> None:
        while True:
            try:
                await self.sweep()
            except DATABASE_ERRORS as exc:
                self._database_failed("sweep", exc, 1)
            await asyncio.sleep(self.settings.sweep_interval)

    async def sweep(self) -> int:
        """Reclaim expired leases and dead-letter expired OTPs; returns rows touched."""
        async with self._sweeping:
            touched = await upkeep.sweep(self._pool, self.settings, self.metrics, self._clock)
        if touched:
            self._wake.set()
        return touched

    async def _listener(self, dsn: str) -> None:
        notice = None if self.quota is None else self.quota.notice
        await upkeep.listen_for_rows(dsn, self.settings.schema, self._wake, notice)
