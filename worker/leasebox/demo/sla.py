"""Whether the demo kept its SLA, and the alerts Prometheus raised, against the script.

The SLA is the pool's promise on the oldest pending message (the age the operator scales
on and the chart's `LeaseboxVerificationSLABreached` alert watches). The control loop samples
that age every second; the breaches are the stretches where it was over the SLA. The
report lays the alerts that fired and cleared beside the scripted events on one timeline,
and says plainly whether the SLA was met.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from leasebox.demo.monitoring import AlertSpan


@dataclass(frozen=True)
class SlaAccount:
    """The SLA, the worst age seen, the breaches, the alerts and the scripted events."""

    sla_seconds: float
    worst_seconds: float | None
    breaches: tuple[tuple[float, float | None], ...]
    alerts: tuple[AlertSpan, ...]
    timeline: tuple[tuple[float, str], ...]
    monitoring: str
    traffic_started_at: float

    @property
    def met(self) -> bool:
        return not self.breaches

    @property
    def breached_seconds(self) -> float:
        return sum((end or start) - start for start, end in self.breaches)


def breaches(
    samples: Sequence[tuple[float, float]], sla: float
) -> tuple[tuple[float, float | None], ...]:
    """The stretches of `(t, age)` samples with the age over `sla`: (first over, first back
    within), the end None when the run ended over it."""
    found: list[tuple[float, float | None]] = []
    start: float | None = None
    for t, age in samples:
        if age > sla and start is None:
            start = t
        elif age <= sla and start is not None:
            found.append((start, t))
            start = None
    if start is not None:
        found.append((start, None))
    return tuple(found)


def account(
    samples: Sequence[tuple[float, float]],
    sla: float,
    *,
    alerts: Sequence[AlertSpan] = (),
    timeline: Sequence[tuple[float, str]] = (),
    monitoring: str = "",
    traffic_started_at: float = 0.0,
) -> SlaAccount:
    return SlaAccount(
        sla_seconds=sla,
        worst_seconds=max((age for _, age in samples), default=None),
        breaches=breaches(samples, sla),
        alerts=tuple(alerts),
        timeline=tuple(sorted(timeline)),
        monitoring=monitoring,
        traffic_started_at=traffic_started_at,
    )


def render_sla(
    sla: SlaAccount, *, late: int, delivered: int, p99: float | None, worst: float | None
) -> list[str]:
    """The SLA verdict in plain words, then the alerts beside the scripted events.

    The SLA is met when every message was sent within it of being enqueued and the oldest
    pending message never waited longer (a message held by a killed worker's lease is not
    pending, yet late all the same).
    """
    oldest = sla.worst_seconds or 0.0
    latency = f"p99 {p99 or 0:.1f} s, max {worst or 0:.1f} s"
    waited = f"the oldest pending message waited up to {oldest:.1f} s"
    if sla.met and not late:
        verdict = (
            f"SLA met: every message was sent within {sla.sla_seconds:g} s of being enqueued "
            f"({latency}); {waited}."
        )
    else:
        over = ""
        if sla.breaches:
            spans = ", ".join(
                f"t={start:.0f}s to " + (f"t={end:.0f}s" if end is not None else "the end")
                for start, end in sla.breaches
            )
            over = f", over the SLA for {sla.breached_seconds:.0f} s ({spans})"
        verdict = (
            f"SLA MISSED: {late} of {delivered} messages took longer than {sla.sla_seconds:g} s "
            f"to be sent ({latency}); {waited}{over}."
        )
    lines = ["", verdict, "", f"Alerts ({sla.monitoring})"]
    if sla.monitoring.startswith("none"):
        return lines
    entries = [(t, "       ", text) for t, text in sla.timeline]
    for alert in sla.alerts:
        entries.append((alert.fired_at, "FIRED  ", f"{alert.name} ({alert.severity})"))
        if alert.cleared_at is not None:
            entries.append((alert.cleared_at, "cleared", alert.name))
    for t, what, text in sorted(entries, key=lambda e: e[0]):
        lines.append(f"  t={t:6.1f}s  {what}  {text}")
    if not sla.alerts:
        lines.append("  no alert fired")
    still = [a.name for a in sla.alerts if a.cleared_at is None]
    if still:
        lines.append(
            f"  still firing at the end: {', '.join(still)} (their windows outlast the demo)"
        )
    return lines
