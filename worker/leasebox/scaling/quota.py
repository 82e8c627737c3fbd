"""What a provider quota means for a pool's size and its SLA: pure, like the policy.

The workers of a pool share their provider account's quota (`runtime.quota` enforces it
through the database). Workers beyond those the quota keeps busy only wait for its tokens,
and when messages arrive faster than the quota no number of workers meets the SLA; the
policy (`policy.decide`) asks for no more than `QuotaOutlook.workers` and reports the
outlook, which the operator turns into a condition and an alert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AT_QUOTA", "QuotaOutlook", "quota_outlook"]

# A pool sending at this share of its quota or more is held back by the quota, not by its
# workers: its send rate says nothing about what a worker could do.
AT_QUOTA = 0.9


@dataclass(frozen=True)
class QuotaOutlook:
    """What the provider quota means for the SLA at the current arrival rate.

    Attributes:
        quota_per_second: the account's quota.
        arrival_per_second: messages arriving per second.
        workers: the workers the quota keeps busy; the policy asks for no more.
        seconds_to_breach: None while arrivals fit in the quota; else the seconds until a
            message arriving then waits longer than the SLA (0: it already does), assuming
            the pool has the account to itself.
    """

    quota_per_second: float
    arrival_per_second: float
    workers: int
    seconds_to_breach: float | None

    @property
    def sufficient(self) -> bool:
        return self.seconds_to_breach is None

    @property
    def message(self) -> str:
        """One sentence for a condition and an alert."""
        if self.seconds_to_breach is None:
            return (
                f"arrivals of {self.arrival_per_second:.1f}/s fit in the quota of "
                f"{self.quota_per_second:g}/s ({self.workers} workers keep it busy)"
            )
        return (
            f"backlog will exceed the SLA in {self.seconds_to_breach:.0f} s at the quota of "
            f"{self.quota_per_second:g}/s (arrivals {self.arrival_per_second:.1f}/s): more "
            "workers would only wait for the quota; raise it or slow the arrivals"
        )


def quota_outlook(
    quota: float | None,
    *,
    arrival: float,
    ready: int,
    oldest_pending_age: float,
    sla_seconds: float,
    worker_throughput: float,
) -> QuotaOutlook | None:
    """The workers the quota keeps busy, and when arrivals above it breach the SLA.

    At arrival rate a above quota q the ready backlog B grows by a - q a second, and a message
    arriving when the backlog is B waits B / q (first in, first out). The first message to
    wait longer than the SLA arrives once B reaches q * SLA, in (q * SLA - B) / (a - q)
    seconds, and the oldest pending message is past the SLA one SLA after that (at once if
    it is already).
    """
    if quota is None:
        return None
    workers = max(1, math.ceil(quota / worker_throughput - 1e-9))
    if arrival <= quota:
        return QuotaOutlook(quota, arrival, workers, None)
    left = (quota * sla_seconds - ready) / (arrival - quota) + sla_seconds
    if oldest_pending_age >= sla_seconds:
        left = 0.0
    return QuotaOutlook(quota, arrival, workers, max(0.0, left))
