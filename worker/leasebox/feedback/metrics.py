"""The receivers' metrics: requests by outcome, and the reputation counters.

`leasebox_feedback_events_total{provider,sending_domain,mailbox_provider,event}` counts each
event once, when it is first stored (a redelivery counts in
`leasebox_feedback_duplicate_events_total`), so that the recording rules' rates are what the
provider sees: hard bounces and complaints over deliveries, per provider and sending domain,
and per mailbox provider for Gmail's and Yahoo's spam-rate rule. `mailbox_provider` is one
of a few fixed names (`gmail`, `yahoo`, `microsoft`, `other`), never a recipient. Events of
messages leasebox does not know are counted too
(`leasebox_feedback_unknown_message_events_total`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from leasebox.feedback.recording import Recorded


class FeedbackMetrics:
    """The receivers' metrics on a registry of their own (or the one given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "leasebox_feedback_requests_total",
            "Webhook requests by provider and outcome (accepted, or why refused).",
            ["provider", "outcome"],
            registry=r,
        )
        self.events = Counter(
            "leasebox_feedback_events_total",
            "Provider events stored (each once), by provider, sending domain, the recipient's "
            "mailbox provider and event (delivered, bounced_hard, bounced_soft, complained, "
            "deferred, rejected, suppressed).",
            ["provider", "sending_domain", "mailbox_provider", "event"],
            registry=r,
        )
        self.duplicates = Counter(
            "leasebox_feedback_duplicate_events_total",
            "Events received again (a service redelivers): stored once, counted here.",
            ["provider"],
            registry=r,
        )
        self.unknown = Counter(
            "leasebox_feedback_unknown_message_events_total",
            "Events stored about a message leasebox has no record of sending.",
            ["provider"],
            registry=r,
        )
        self.suppressions = Counter(
            "leasebox_feedback_suppressions_total",
            "Mailboxes put on (or kept longer on) a suppression list by an event, by reason.",
            ["provider", "reason"],
            registry=r,
        )

    def request(self, provider: str, outcome: str) -> None:
        """Count a request that stored nothing: why it was refused, or what it was."""
        self.requests.labels(provider, outcome).inc()

    def recorded(self, provider: str, outcome: Recorded) -> None:
        """Count an accepted request and what it stored."""
        self.requests.labels(provider, "accepted" if outcome.fresh else "replayed").inc()
        if outcome.duplicates:
            self.duplicates.labels(provider).inc(outcome.duplicates)
        for stored in outcome.stored:
            event = stored.event
            self.events.labels(
                provider, event.sending_domain, event.mailbox_provider, event.outcome
            ).inc()
            if not stored.linked:
                self.unknown.labels(provider).inc()
            if stored.listed:
                self.suppressions.labels(provider, stored.listed).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
