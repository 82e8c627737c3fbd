"""The demo's script and its clients: what happens when, and what the callers saw.

`Scenario` is the timeline, pure data: a steady trickle of logins, a burst in which clients
retry part of their requests with the same Idempotency-Key (as a mobile client does after a
timeout), a window in which the mail provider fails transiently, one login to an address the
provider rejects for good, the moment a worker is killed, and a login to a mistyped address
that bounces after it was sent (and is then suppressed). A shortened run scales every
time on the timeline, so `--quick` exercises the same story in less time.

`LoadClients` plays the callers against the real HTTP API and records, per request, which
challenge the API confirmed: the first of the demo's three witnesses.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

FULL_DURATION = 60.0
REJECTED_ADDRESS = "bounce@rejected.example"
# Accepted by the SMTP server, then reported as a hard bounce (`demo.bounce`).
BOUNCING_ADDRESS = "mistyped@bounces.example"


@dataclass(frozen=True)
class Scenario:
    """The timeline of one run, in seconds from the start of traffic."""

    name: str = "full"
    duration: float = FULL_DURATION
    trickle_per_second: float = 4.0
    burst_start: float = 8.0
    burst_seconds: float = 10.0
    burst_requests: int = 1500
    retry_fraction: float = 0.2
    failure_start: float = 13.0
    failure_seconds: float = 10.0
    rejected_at: float = 4.0
    checks_at: float = 2.0
    kill_at: float = 27.0
    mistyped_at: float = 5.0
    bounce_at: float = 32.0
    sink_delay_seconds: float = 0.03

    @classmethod
    def shortened(cls, duration: float) -> Scenario:
        """The same story in `duration` seconds (every time and the burst size scaled)."""
        if duration < 15:
            raise ValueError("a demo needs at least 15 seconds of traffic")
        full = cls()
        if duration >= full.duration:
            return replace(full, duration=duration)
        k = duration / full.duration
        return replace(
            full,
            name=f"shortened ({duration:g}s)",
            duration=duration,
            burst_start=full.burst_start * k,
            burst_seconds=full.burst_seconds * k,
            burst_requests=max(50, round(full.burst_requests * k)),
            failure_start=full.failure_start * k,
            failure_seconds=full.failure_seconds * k,
            rejected_at=full.rejected_at * k,
            checks_at=full.checks_at * k,
            kill_at=full.kill_at * k,
            mistyped_at=full.mistyped_at * k,
            bounce_at=full.bounce_at * k,
        )

    @property
    def burst_end(self) -> float:
        return self.burst_start + self.burst_seconds

    @property
    def failure_end(self) -> float:
        return self.failure_start + self.failure_seconds

    def provider_failing(self, t: float) -> bool:
        return self.failure_start <= t < self.failure_end

    def phase(self, t: float) -> str:
        """A few words on what is going on at `t`, for the live display."""
        parts = []
        if t >= self.duration:
            return "draining"
        parts.append("burst" if self.burst_start <= t < self.burst_end else "trickle")
        if self.provider_failing(t):
            parts.append("provider failing (451)")
        return ", ".join(parts)

    def arrivals(self, rng: random.Random) -> list[float]:
        """When each logical login request is made: trickle everywhere, plus the burst."""
        times: list[float] = []
        t = 0.0
        while True:
            t += rng.expovariate(self.trickle_per_second)
            if t >= self.duration:
                break
            times.append(t)
        step = self.burst_seconds / self.burst_requests
        times += [self.burst_start + (i + rng.random()) * step for i in range(self.burst_requests)]
        return sorted(times)


@dataclass
class ClientRecord:
    """What the callers saw, request by request."""

    requests: int = 0
    created: int = 0
    replayed: int = 0
    errors: int = 0
    replay_mismatches: int = 0
    challenges: set[str] = field(default_factory=set)
    created_at: deque[float] = field(default_factory=deque)
    checks: dict[str, bool] = field(default_factory=dict)

    def arrival_rate(self, now: float, window: float = 3.0) -> float:
        """New challenges per second over the last `window` seconds."""
        while self.created_at and self.created_at[0] < now - window:
            self.created_at.popleft()
        return len(self.created_at) / window


class LoadClients:
    """Concurrent HTTP callers of `POST /otp/email`."""

    def __init__(self, base_url: str, scenario: Scenario, seed: int, concurrency: int = 64):
        self.base_url = base_url.rstrip("/")
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.record = ClientRecord()
        self._limit = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, session: aiohttp.ClientSession, started: float) -> None:
        """Make every scheduled request at its time, then wait for the answers."""
        specials = [
            (self.scenario.checks_at, self._checks),
            (self.scenario.rejected_at, self._rejected),
            (self.scenario.mistyped_at, self.mistyped),
        ]
        for n, at in enumerate(self.scenario.arrivals(self.rng)):
            while specials and specials[0][0] <= at:
                special_at, action = specials.pop(0)
                await _sleep_until(started + special_at)
                self._spawn(action(session))
            await _sleep_until(started + at)
            retried = self.rng.random() < self.scenario.retry_fraction
            body = {"email": f"user{n}@example.com", "user_id": f"user-{n}"}
            self._spawn(
                self._login(session, f"login-{n}-{self.rng.getrandbits(48):x}", body, retried)
            )
        for _, action in specials:
            self._spawn(action(session))
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(
        self, session: aiohttp.ClientSession, key: str | None, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Idempotency-Key": key} if key is not None else {}
        async with self._limit:
            self.record.requests += 1
            async with session.post(
                f"{self.base_url}/otp/email", json=body, headers=headers
            ) as response:
                payload = await response.json(content_type=None)
                return response.status, payload if isinstance(payload, dict) else {}

    async def _accepted(
        self, session: aiohttp.ClientSession, key: str, body: dict[str, Any]
    ) -> str | None:
        """POST until the API answers; a client retries errors with the same key."""
        for attempt in range(4):
            try:
                status, payload = await self._post(session, key, body)
            except (aiohttp.ClientError, TimeoutError):
                status, payload = 599, {}
            if status in (200, 201):
                if status == 201:
                    self.record.created += 1
                    self.record.created_at.append(time.monotonic())
                else:
                    self.record.replayed += 1
                challenge = str(payload.get("challenge_id"))
                self.record.challenges.add(challenge)
                return challenge
            if status < 500:
                return None
            self.record.errors += 1
            await asyncio.sleep(0.2 * (attempt + 1))
        return None

    async def _login(
        self, session: aiohttp.ClientSession, key: str, body: dict[str, Any], retried: bool
    ) -> None:
        if not retried:
            await self._accepted(session, key, body)
            return
        # The client gave up waiting and asked again with the same key while the first
        # request may still be in flight: both must name one challenge.
        first = asyncio.create_task(self._accepted(session, key, body))
        await asyncio.sleep(self.rng.uniform(0.0, 0.15))
        second = await self._accepted(session, key, body)
        first_challenge = await first
        if first_challenge and second and first_challenge != second:
            self.record.replay_mismatches += 1

    async def _rejected(self, session: aiohttp.ClientSession) -> None:
        body = {"email": REJECTED_ADDRESS, "user_id": "user-bounce"}
        await self._accepted(session, f"login-bounce-{self.rng.getrandbits(48):x}", body)

    async def mistyped(self, session: aiohttp.ClientSession) -> None:
        """A login to the address that bounces later (`demo.bounce`); the demo calls it again
        after the bounce, when the worker must not send to it."""
        body = {"email": BOUNCING_ADDRESS, "user_id": "user-mistyped"}
        await self._accepted(session, f"login-mistyped-{self.rng.getrandbits(48):x}", body)

    async def _checks(self, session: aiohttp.ClientSession) -> None:
        body = {"email": "check@example.com", "user_id": "user-check"}
        status, payload = await self._post(session, None, body)
        self.record.checks["missing key -> 400"] = (
            status == 400 and payload.get("field") == "Idempotency-Key"
        )
        status, payload = await self._post(session, "check-bad-email", {"email": "not-an-email"})
        self.record.checks["invalid email -> 400"] = (
            status == 400 and payload.get("field") == "email"
        )
        key = f"check-{self.rng.getrandbits(48):x}"
        first = await self._accepted(session, key, body)
        status, _ = await self._post(session, key, {**body, "email": "other@example.com"})
        self.record.checks["reused key, other body -> 422"] = first is not None and status == 422


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
