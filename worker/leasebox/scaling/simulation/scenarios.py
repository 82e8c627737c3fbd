"""The workloads `leasebox simulate` compares policies on: built-in scenarios and CSV traces.

Every policy must see the same messages and the same worker speed, or the
comparison measures luck. So a workload is generated once, from a seed, as
plain per-second arrays (arrivals, nominal per-worker throughput, and one
standard-normal draw of throughput noise per second) that every policy replays.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BURST_SCENARIOS",
    "QUOTAS",
    "SCENARIOS",
    "RatePoint",
    "TraceError",
    "Workload",
    "build_workload",
    "load_trace",
    "rates_from_trace",
]

BASE_ARRIVALS = 30.0
"""Messages per second of the built-in scenarios' base load (1.5 workers' worth)."""


class TraceError(ValueError):
    """A CSV trace that cannot be read, with the line at fault."""


@dataclass(frozen=True)
class RatePoint:
    """One row of a trace: from `t_seconds` on, messages arrive at `arrivals_per_second`."""

    t_seconds: float
    arrivals_per_second: float


@dataclass(frozen=True)
class Workload:
    """Per-second inputs shared by every policy in one comparison.

    Attributes:
        name: the scenario or trace name.
        description: one line for humans.
        arrivals: messages arriving in each second.
        throughput: nominal messages per second of one ready worker in each second.
        noise: one standard-normal draw per second; a pool of n ready workers
            sends `n * throughput * (1 + sigma * noise / sqrt(n))` in that second,
            as the sum of n independent workers with relative spread sigma would.
        quota_per_second: the provider account's send quota, which no number of
            workers exceeds (None: none); the leasebox policy is told it, as the
            operator is by the pool's spec.
    """

    name: str
    description: str
    arrivals: tuple[int, ...]
    throughput: tuple[float, ...]
    noise: tuple[float, ...]
    quota_per_second: float | None = None

    @property
    def duration(self) -> int:
        """Length in seconds."""
        return len(self.arrivals)


RateFn = Callable[[int, int], float]


def _steady(t: int, duration: int) -> float:
    return BASE_ARRIVALS


def _event_start(duration: int) -> int:
    return duration // 3


def _login_burst(t: int, duration: int) -> float:
    start = _event_start(duration)
    return BASE_ARRIVALS * (10.0 if start <= t < start + 120 else 1.0)


def _flash_crowd(t: int, duration: int) -> float:
    start = _event_start(duration)
    return BASE_ARRIVALS * (50.0 if start <= t < start + 30 else 1.0)


def _diurnal(t: int, duration: int) -> float:
    phase = 2 * math.pi * t / duration
    return BASE_ARRIVALS * (0.2 + 1.6 * (1 - math.cos(phase)) / 2)


def _normal_speed(t: int, duration: int) -> float:
    return 1.0


def _surge(t: int, duration: int) -> float:
    start = _event_start(duration)
    return BASE_ARRIVALS * (3.0 if start <= t < start + 600 else 1.0)


def _slowdown_speed(t: int, duration: int) -> float:
    start = _event_start(duration)
    return 0.5 if start <= t < start + 600 else 1.0


SCENARIOS: dict[str, tuple[str, RateFn, RateFn]] = {
    "steady": ("constant 30 msg/s", _steady, _normal_speed),
    "login-burst": ("30 msg/s with a 10x login burst for two minutes", _login_burst, _normal_speed),
    "diurnal": ("a day compressed into the run: 6 to 54 msg/s", _diurnal, _normal_speed),
    "provider-slowdown": (
        "30 msg/s; per-worker throughput halves for ten minutes",
        _steady,
        _slowdown_speed,
    ),
    "flash-crowd": ("30 msg/s with a 50x flash crowd for 30 seconds", _flash_crowd, _normal_speed),
    "provider-quota": (
        "30 msg/s with a 3x surge for ten minutes, into an account quota of 50 msg/s",
        _surge,
        _normal_speed,
    ),
}
"""Built-in scenarios: name -> (description, arrival rate, relative worker speed)."""

QUOTAS: dict[str, float] = {"provider-quota": 50.0}
"""The provider quota of the scenarios that have one, messages per second."""

BURST_SCENARIOS = frozenset({"login-burst", "flash-crowd"})
"""Scenarios on which the policy must also be the cheapest."""


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: exact for small means, normal approximation for large ones."""
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, count, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


def build_workload(
    name: str,
    description: str,
    rate: RateFn,
    speed: RateFn,
    *,
    duration: int,
    seed: int,
    worker_throughput: float,
    quota_per_second: float | None = None,
) -> Workload:
    """Draw a workload: the same seed gives the same messages and the same noise."""
    if duration <= 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    arrival_rng = random.Random(f"{seed}:arrivals")
    noise_rng = random.Random(f"{seed}:noise")
    arrivals = tuple(_poisson(arrival_rng, rate(t, duration)) for t in range(duration))
    throughput = tuple(worker_throughput * speed(t, duration) for t in range(duration))
    noise = tuple(noise_rng.gauss(0.0, 1.0) for _ in range(duration))
    return Workload(name, description, arrivals, throughput, noise, quota_per_second)


def load_trace(path: Path) -> list[RatePoint]:
    """Read a `t_seconds,arrivals_per_second` CSV; raise TraceError naming the bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TraceError(f"{path}: cannot read trace: {error.strerror or error}") from error
    rows = list(csv.reader(text.splitlines()))
    if not rows or [cell.strip() for cell in rows[0]] != ["t_seconds", "arrivals_per_second"]:
        raise TraceError(f"{path}:1: expected the header 't_seconds,arrivals_per_second'")
    points: list[RatePoint] = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != 2:
            raise TraceError(f"{path}:{line}: expected 2 columns, got {len(row)}")
        try:
            t, value = float(row[0]), float(row[1])
        except ValueError:
            raise TraceError(f"{path}:{line}: not a number in {','.join(row)!r}") from None
        if not (math.isfinite(t) and math.isfinite(value)) or t < 0 or value < 0:
            raise TraceError(f"{path}:{line}: values must be finite and >= 0")
        if points and t <= points[-1].t_seconds:
            raise TraceError(
                f"{path}:{line}: t_seconds must increase ({t:g} after {points[-1].t_seconds:g})"
            )
        points.append(RatePoint(t, value))
    if not points:
        raise TraceError(f"{path}: the trace has no rows")
    return points


def rates_from_trace(points: list[RatePoint]) -> RateFn:
    """A step function: each row's rate holds until the next row; zero before the first."""
    times = [point.t_seconds for point in points]

    def rate(t: int, duration: int) -> float:
        index = bisect.bisect_right(times, t) - 1
        return points[index].arrivals_per_second if index >= 0 else 0.0

    return rate
