"""A pool's providers' reputation, from the hourly event counts: what the operator reports.

A provider judges the account behind a pool by its bounce and complaint rates, and pauses
it past a line (SES: reviews at 5 % bounces and 0.1 % complaints). The receivers count each
event once per hour in `feedback_hours`, so the rates of the last day and week are a sum of
a few hundred rows, cheap enough for the operator's poll (which reads them every few
minutes, not every poll). A pool's providers are those that reported on its kinds in the
last week; each is judged over all it sent, as the provider judges the whole account. A
rate counts only over enough volume, as the alert rules do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from leasebox.db.queries import DEFAULT_SCHEMA, query_bytes

# The page thresholds of the alert rules, and the volume under which a rate says nothing.
BOUNCE_PAGE = 0.05
COMPLAINT_PAGE = 0.001
BOUNCE_VOLUME = 100
COMPLAINT_VOLUME = 1000


@dataclass(frozen=True)
class ProviderReputation:
    """One provider's event counts over the last day and the last week."""

    provider: str
    delivered_1d: int
    bounced_1d: int
    complained_1d: int
    delivered_7d: int
    bounced_7d: int
    complained_7d: int

    @property
    def bounce_rate(self) -> float | None:
        """Hard bounces over deliveries and hard bounces in the last day (None: too few)."""
        volume = self.delivered_1d + self.bounced_1d
        return self.bounced_1d / volume if volume >= BOUNCE_VOLUME else None

    @property
    def complaint_rate(self) -> float | None:
        """Complaints over deliveries in the last day (None: too few deliveries)."""
        volume = self.delivered_1d
        return self.complained_1d / volume if volume >= COMPLAINT_VOLUME else None


@dataclass(frozen=True)
class Verdict:
    """What the reputation condition says: healthy True, False, or None (nothing to judge)."""

    healthy: bool | None
    reason: str
    message: str


def judge(providers: list[ProviderReputation]) -> Verdict:
    """The pool's reputation condition from its providers' counts."""
    if not providers:
        return Verdict(None, "NoFeedback", "no provider events about the pool's kinds this week")
    breaches = []
    for p in providers:
        bounce, complaint = p.bounce_rate, p.complaint_rate
        if bounce is not None and bounce > BOUNCE_PAGE:
            breaches.append(("BounceRateHigh", f"{p.provider} hard-bounced {bounce:.1%} today"))
        if complaint is not None and complaint > COMPLAINT_PAGE:
            breaches.append(
                ("ComplaintRateHigh", f"{p.provider} had {complaint:.2%} spam complaints today")
            )
    if breaches:
        message = "; ".join(text for _, text in breaches)
        return Verdict(False, breaches[0][0], f"{message}: the provider may pause the account")
    judged = [p.provider for p in providers if p.bounce_rate is not None]
    if not judged:
        return Verdict(None, "TooFewEvents", "too few deliveries today to judge the rates")
    return Verdict(True, "WithinLimits", f"{', '.join(judged)}: bounce and complaint rates ok")


async def fetch_reputation_async(
    conn: psycopg.AsyncConnection[Any], kinds: list[str], *, schema: str = DEFAULT_SCHEMA
) -> list[ProviderReputation]:
    """The counts of every provider that reported on `kinds` in the last week."""
    async with conn.cursor() as cur:
        await cur.execute(query_bytes("reputation", schema), {"kinds": kinds})
        return [ProviderReputation(str(r[0]), *(int(v) for v in r[1:])) async for r in cur]
