"""`leasebox demo`: the whole flow on one machine, and a verdict on what leasebox guarantees.

It starts an embedded PostgreSQL, a real SMTP server, the reference OTP API and a pool of
real worker processes sized every second by the operator's own scaling policy, then plays a
scripted bad day (a login burst with client retries, a provider outage, a rejected address,
a worker killed mid-send, an address that bounces after it was sent and is then suppressed)
and checks the outcome against three witnesses: what the API told its clients, what the
outbox rows say, and what the SMTP server received. The exit code is 0 only when no accepted
send was lost and every duplicate has a crash or lease loss behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import psycopg
from aiohttp import web
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from leasebox.db.migrations import migrate
from leasebox.db.queries import query
from leasebox.demo.bounce import BouncingService
from leasebox.demo.display import Display, status_line
from leasebox.demo.evidence import DEMO_SQL, EvidenceLog, gather_evidence
from leasebox.demo.monitoring import Alerting, Observatory
from leasebox.demo.otp_api import OtpApiSettings, build_app, create_schema
from leasebox.demo.pool import WorkerOptions, WorkerPool
from leasebox.demo.report import Kill, ScalingEvent, Summary, summarise
from leasebox.demo.scenario import BOUNCING_ADDRESS, REJECTED_ADDRESS, LoadClients, Scenario
from leasebox.demo.sla import SlaAccount, account
from leasebox.producer.payload_crypto import KEYS_VARIABLE, generate_key
from leasebox.scaling.policy import Observation, PolicyConfig, PolicyState, decide
from leasebox.store.backlog import Backlog, fetch_backlog_async
from leasebox.testing.embedded import EmbeddedPostgres
from leasebox.testing.ports import free_port
from leasebox.testing.smtp_sink import SmtpSink

DATABASE = "leasebox_demo"
SCHEMA = "leasebox"
RATE_WINDOW_SECONDS = 3.0


@dataclass(frozen=True)
class DemoSettings:
    """One run of the demo.

    data_dir: where the embedded PostgreSQL and the worker logs live (inside `build/`).
    keep_data: reuse an existing cluster in `data_dir` instead of starting from scratch.
    keep_running: after the summary, leave the API, the workers and the database up.
    scenario: the timeline (full, or shortened with --duration/--quick).
    seed: makes the request schedule and the retried requests reproducible.
    min_workers, max_workers, sla_seconds: the scaling policy's bounds and promise.
    drain_timeout: how long to wait after the traffic for the backlog to empty.
    observatory: a Prometheus to run with the chart's rules, and the operator's metrics to
    export (None: no alerts).
    clear_timeout: how long to wait after the drain for the SLA alerts to clear.
    """

    data_dir: Path = Path("build/leasebox-demo")
    keep_data: bool = False
    keep_running: bool = False
    scenario: Scenario = field(default_factory=Scenario)
    seed: int = 7
    min_workers: int = 1
    max_workers: int = 6
    sla_seconds: float = 10.0
    drain_timeout: float = 60.0
    observatory: Observatory | None = None
    clear_timeout: float = 30.0

    def policy_config(self) -> PolicyConfig:
        k = min(1.0, self.scenario.duration / 60.0)
        return PolicyConfig(
            min_replicas=self.min_workers,
            max_replicas=self.max_workers,
            sla_seconds=self.sla_seconds,
            poll_interval_seconds=1.0,
            scale_down_stabilization_seconds=max(5.0, 10.0 * k),
            initial_worker_throughput=30.0,
            startup_seconds=4.0,
            backlog_budget_fraction=0.5,
            rate_window_seconds=RATE_WINDOW_SECONDS,
        )


class _Run:
    """The live objects of one run and the control loop that ties them together."""

    def __init__(self, settings: DemoSettings, display: Display, dsn: str) -> None:
        self.settings = settings
        self.display = display
        self.dsn = dsn
        self.spec = settings.policy_config()
        self.state = PolicyState()
        self.log = EvidenceLog()
        self.started = time.monotonic()
        self.started_at = time.time()
        observatory = settings.observatory
        self.alerting = None if observatory is None else Alerting(observatory, settings)
        self.bouncing = BouncingService(dsn, SCHEMA)
        self.sink = SmtpSink(
            rejected=[REJECTED_ADDRESS],
            delay_seconds=settings.scenario.sink_delay_seconds,
            keep_bodies=True,
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def control(
        self, conn: psycopg.AsyncConnection[Any], pool: WorkerPool, clients: LoadClients
    ) -> None:
        """Observe the backlog, decide the replicas, reconcile the pool: once per second."""
        backlog = await fetch_backlog_async(
            conn, ["otp"], schema=SCHEMA, window_seconds=RATE_WINDOW_SECONDS
        )
        now = time.monotonic()
        observation = Observation(
            now=now - self.started,
            ready=backlog.ready,
            pending=backlog.pending,
            oldest_ready_age_seconds=backlog.oldest_ready_age_seconds,
            oldest_pending_age_seconds=backlog.oldest_pending_age_seconds,
            arrival_per_second=clients.record.arrival_rate(now, RATE_WINDOW_SECONDS),
            sent_per_second=backlog.sent_per_second,
            replicas=pool.desired,
            ready_replicas=pool.ready_replicas,
        )
        decision = decide(observation, self.spec, self.state)
        self.state = decision.state
        self.log.oldest.append((round(self.elapsed(), 1), backlog.oldest_pending_age_seconds))
        self._export(backlog, clients, pool, decision.replicas)
        if decision.replicas != pool.desired:
            self.log.scaling.append(
                ScalingEvent(self.elapsed(), pool.desired, decision.replicas, decision.reason)
            )
            self.display.event(self.elapsed(), decision.reason)
        pool.desired = decision.replicas
        for line in await pool.reconcile():
            self.display.event(self.elapsed(), line)
        cur = await conn.execute(query("progress", SCHEMA, DEMO_SQL))
        sent, dead, unfinished = await cur.fetchone() or (0, 0, 0)
        self.log.unfinished = int(unfinished)
        totals = pool.totals()
        self.display.status(
            status_line(
                t=self.elapsed(),
                phase=self.settings.scenario.phase(self.elapsed()),
                accepted=len(clients.record.challenges),
                delivered=int(sent),
                pending=backlog.pending,
                oldest=backlog.oldest_pending_age_seconds,
                desired=pool.desired,
                ready=pool.ready_replicas,
                retries=int(totals["retries"]),
                dead=int(dead),
            )
        )

    def _export(
        self, backlog: Backlog, clients: LoadClients, pool: WorkerPool, desired: int
    ) -> None:
        """The operator's metrics of this poll, and the workers Prometheus should scrape."""
        if self.alerting is not None:
            arrived = clients.record.arrival_rate(time.monotonic(), RATE_WINDOW_SECONDS)
            self.alerting.export(
                backlog,
                arrived=arrived,
                replicas=pool.desired,
                ready=pool.ready_replicas,
                desired=desired,
                worker_ports=pool.metrics_ports(),
            )

    def sla_account(self) -> SlaAccount:
        alerting = self.alerting
        monitoring = "none: run without Prometheus" if alerting is None else alerting.described
        scenario = self.settings.scenario
        scripted = [
            (scenario.burst_start, f"burst of {scenario.burst_requests} logins begins"),
            (scenario.burst_end, "burst ends"),
            *self.log.timeline,
        ]
        return account(
            self.log.oldest,
            self.settings.sla_seconds,
            alerts=alerting.watch.all() if alerting is not None else (),
            timeline=scripted,
            monitoring=monitoring,
            traffic_started_at=self.started_at,
        )

    async def kill_busiest(self, conn: psycopg.AsyncConnection[Any], pool: WorkerPool) -> None:
        """SIGKILL the running worker holding the most leases, then note what it held."""
        deadline = time.monotonic() + 5.0
        victim = None
        while victim is None and time.monotonic() < deadline:
            cur = await conn.execute(query("leases_by_worker", SCHEMA, DEMO_SQL))
            held = {str(w): int(n) for w, n in await cur.fetchall()}
            # A worker that has sent for a while has sends in flight, not just fresh claims.
            settled = pool.running_ids(ready_for=2.0) or pool.running_ids()
            candidates = [(held.get(w, 0), w) for w in settled if held.get(w, 0)]
            if candidates:
                victim = max(candidates)[1]
            else:
                await asyncio.sleep(0.1)
        if victim is None or not await pool.kill(victim):
            self.display.event(self.elapsed(), "no worker had a send in flight to kill")
            return
        at = self.elapsed()
        await asyncio.sleep(0.3)  # the server notices the dropped connection
        cur = await conn.execute(query("leased_by_worker", SCHEMA, DEMO_SQL), {"worker_id": victim})
        leased = frozenset(int(r[0]) for r in await cur.fetchall())
        self.log.kills.append(Kill(victim, at, leased))
        self.log.timeline.append((round(at, 1), f"worker {victim} killed with SIGKILL"))
        self.display.event(
            at,
            f"killed {victim} with SIGKILL while it held {len(leased)} lease(s); they come "
            f"back after the {pool.options.lease_seconds:g}s lease expires",
        )

    async def script(
        self,
        conn: psycopg.AsyncConnection[Any],
        pool: WorkerPool,
        clients: LoadClients,
        session: aiohttp.ClientSession,
    ) -> None:
        """The scripted faults, each at its time."""
        scenario = self.settings.scenario
        await self._at(scenario.failure_start)
        self.sink.failing = True
        self._scripted("the SMTP server starts answering 451 (transient)")
        await self._at(scenario.failure_end)
        self.sink.failing = False
        self._scripted("the SMTP server accepts mail again")
        await self._at(scenario.kill_at)
        await self.kill_busiest(conn, pool)
        await self._at(scenario.bounce_at)
        await self.bounce(conn, clients, session)

    async def bounce(
        self,
        conn: psycopg.AsyncConnection[Any],
        clients: LoadClients,
        session: aiohttp.ClientSession,
    ) -> None:
        """The mail service reports the mistyped address's bounce; then it is asked for again."""
        report = await self.bouncing.bounce(conn, session, self.elapsed())
        if report is None:
            self._scripted("the mistyped address was never sent to")
            return
        self.log.bounce_answer = f"{report.status} {report.answer}"
        self.display.event(
            report.at_seconds,
            f"the mail service reports a hard bounce (5.1.1) for {BOUNCING_ADDRESS}, signed "
            f"as Resend signs it; the receiver answers {report.status} ({report.answer}) and "
            "suppresses the mailbox",
        )
        await clients.mistyped(session)
        self._scripted(
            f"a new login code for {BOUNCING_ADDRESS} is accepted; the worker that claims it "
            "ends it suppressed, and the SMTP server never sees it",
        )

    def _scripted(self, text: str) -> None:
        self.display.event(self.elapsed(), text)
        self.log.timeline.append((round(self.elapsed(), 1), text))

    async def _at(self, t: float) -> None:
        delay = self.started + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def _every(seconds: float, action: Callable[[], Awaitable[None]]) -> None:
    while True:
        started = time.monotonic()
        await action()
        await asyncio.sleep(max(0.05, seconds - (time.monotonic() - started)))


def _prepare_cluster(settings: DemoSettings) -> EmbeddedPostgres:
    pg_dir = settings.data_dir / "postgres"
    server = EmbeddedPostgres(pg_dir)
    if not settings.keep_data and settings.data_dir.exists():
        with contextlib.suppress(RuntimeError):  # a stale pid file of a crashed run
            server.stop("immediate")
        shutil.rmtree(settings.data_dir)
    server.start()
    name = sql.Identifier(DATABASE)
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    migrate(server.dsn_for(DATABASE), SCHEMA)
    return server


async def run_demo(
    settings: DemoSettings, out: TextIO, live: bool, report: Callable[[Summary], None]
) -> Summary:
    """Run the scenario end to end and hand the summary to `report` (which prints it).

    With `keep_running`, `report` is called first, then the services stay up until cancelled.
    """
    display = Display(out, live=live)
    wall_start = time.monotonic()
    display.note(f"starting an embedded PostgreSQL in {settings.data_dir} ...")
    server = await asyncio.to_thread(_prepare_cluster, settings)
    try:
        return await _run_with_database(settings, display, server, wall_start, report)
    finally:
        await asyncio.to_thread(server.stop)


async def _run_with_database(
    settings: DemoSettings,
    display: Display,
    server: EmbeddedPostgres,
    wall_start: float,
    report: Callable[[Summary], None],
) -> Summary:
    dsn = server.dsn_for(DATABASE)
    os.environ[KEYS_VARIABLE] = generate_key()  # codes are encrypted at rest in the outbox
    run = _Run(settings, display, dsn)
    api_settings = OtpApiSettings()
    api_port = free_port()
    db_pool = AsyncConnectionPool(dsn, min_size=4, max_size=16, open=False)
    await db_pool.open(wait=True)
    runner = web.AppRunner(build_app(db_pool, api_settings), access_log=None)
    run.sink.start()
    session = aiohttp.ClientSession()
    options = WorkerOptions(
        dsn=dsn,
        provider_url=f"{run.sink.url}&pool_size=8",
        log_dir=settings.data_dir / "logs",
        environment={KEYS_VARIABLE: os.environ[KEYS_VARIABLE]},
    )
    pool = WorkerPool(options, session)
    tasks: list[asyncio.Task[None]] = []
    try:
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
            run.bouncing.serving() as feedback_url,
        ):
            await create_schema(conn)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", api_port).start()
            base_url = f"http://127.0.0.1:{api_port}"
            display.note(
                f"OTP API on {base_url}, SMTP server on {run.sink.url}, "
                f"feedback receiver on {feedback_url}"
            )
            await pool.scale_to(settings.min_workers)
            while pool.ready_replicas < settings.min_workers:
                await asyncio.sleep(0.1)
                for line in await pool.reconcile():
                    display.note(line)
            if run.alerting is not None:
                await run.alerting.start(session)
                display.note(f"Prometheus on {run.alerting.url}, with the chart's alert rules")
            clients = LoadClients(base_url, settings.scenario, settings.seed)
            run.started = time.monotonic()
            run.started_at = time.time()
            display.note(
                f"scenario: {settings.scenario.name}, traffic for {settings.scenario.duration:g}s"
            )
            tasks = [
                asyncio.create_task(_every(1.0, lambda: run.control(conn, pool, clients))),
                asyncio.create_task(run.script(conn, pool, clients, session)),
            ]
            alerting = run.alerting
            if alerting is not None:
                tasks.append(
                    asyncio.create_task(
                        _every(1.0, lambda: alerting.watch.look(session, run.elapsed()))
                    )
                )
            await clients.run(session, run.started)
            await run._at(settings.scenario.duration)
            run._scripted("traffic over; waiting for the backlog to drain")
            drain_deadline = time.monotonic() + settings.drain_timeout
            while not _drained(run, tasks):
                if time.monotonic() >= drain_deadline:
                    break
                await asyncio.sleep(0.5)
            if run.alerting is not None:
                await run.alerting.wait_for_sla_alerts(settings.clear_timeout)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await pool.reconcile()
            display.finish()
            evidence = await gather_evidence(
                conn,
                run.log,
                clients.record,
                run.sink,
                pool.totals(),
                api_settings,
                scenario=settings.scenario.name,
                wall_seconds=time.monotonic() - wall_start,
                sla=run.sla_account(),
            )
            summary = summarise(evidence)
            report(summary)
            if settings.keep_running:
                await pool.scale_to(settings.min_workers)
                display.keep_running(base_url, pool, run.sink.url, server, DATABASE)
                await asyncio.Event().wait()
            return summary
    finally:
        for task in tasks:
            task.cancel()
        if run.alerting is not None:
            await run.alerting.stop()
        await pool.close()
        await session.close()
        await runner.cleanup()
        await db_pool.close()
        run.sink.stop()


def _drained(run: _Run, tasks: list[asyncio.Task[None]]) -> bool:
    script_done = len(tasks) > 1 and tasks[1].done()
    return script_done and run.log.unfinished == 0
