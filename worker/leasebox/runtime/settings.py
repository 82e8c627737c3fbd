"""The worker's settings: one frozen, validated value built once at start-up.

`leasebox.config` says what may be set (names, variables, readers, defaults) and is shared
with the operator; this module says what a worker may run with: the values taken together,
checked against each other (a priority for a kind it does not claim, a burst without a
quota), so that a bad combination stops the worker with one line before it claims anything.
"""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field

from leasebox import config
from leasebox.db.queries import validate_schema_name
from leasebox.errors import ConfigurationError
from leasebox.messages import DEFAULT_RECEIPT_TTL_SECONDS, KIND_PATTERN

MAX_RETENTION_SECONDS = 36500 * 86400.0
# A kind's aging when its priority gives none: the default SLA of a pool.
DEFAULT_AGING_SECONDS = 60.0
# Of every claim's rows, this share at most may go to messages past their kind's aging ahead
# of higher priorities: enough that an aged message is served within a few claims, little
# enough that an urgent kind keeps three quarters of the throughput.
AGED_SHARE = 0.25


def default_worker_id() -> str:
    """`hostname-pid`: unique per process, and the pod name on Kubernetes."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerSettings:
    """How one worker process claims, sends and settles messages.

    kinds: message kinds this worker claims (it never touches others).
    schema: the PostgreSQL schema holding the outbox.
    concurrency: sends in flight at once.
    batch_size: most rows claimed per statement; also how many claimed rows may wait for a
        free send slot, so that a slot never waits for a claim round trip, and how many rows
        whose outcome is being written may be held beyond `capacity`.
    lease_seconds: how long a claim is exclusive; a send still running at half of it extends it.
    poll_interval: longest idle wait before looking for ready rows again (NOTIFY wakes sooner).
    listen: wake on the outbox's NOTIFY as rows arrive; polling alone when False.
    grace_seconds: after SIGTERM, how long in-flight sends may take to finish.
    drain: exit once nothing is ready (batch jobs, benchmarks) instead of waiting for more.
    max_attempts: attempt limit for rows that carry none of their own (a row's own wins).
    backoff_base, backoff_max: retry delay `min(max, base * 2**(attempt-1))`, with jitter.
    retention_seconds: when set, the worker drops the days of sent messages, their history
        and expired receipts older than this, hourly (`leasebox.store.pruning`); at least
        the receipt TTL, so that a retried request never outlives its send. None keeps
        everything.
    feedback_provider_days: how long a provider's own refusal of a suppressed address
        (Postmark's 406) keeps the mailbox listed; the same variable sets the feedback
        receiver's rule for the services' suppression events, so both agree.
    priorities: each kind's priority in the claim (higher first; unlisted kinds 0) and
        aging (`aging_of`): a message that has waited that long since its creation goes
        ahead of higher priorities, within a share of each claim (`AGED_SHARE`), so that
        no kind starves.
    quota_rate: the provider account's send quota in messages a second, shared through the
        database by every worker naming the same `quota_account` (`runtime.quota`); None
        sends as fast as the provider takes it.
    quota_burst: tokens of credit the quota keeps at most (None: a second's worth).
    quota_account: the provider account the quota is for (the command defaults it to the
        provider URL without credentials or options).
    worker_id: recorded in `leased_by`, and in every log line.
    """

    kinds: tuple[str, ...] = config.KINDS.default
    schema: str = config.SCHEMA.default
    concurrency: int = config.CONCURRENCY.default
    batch_size: int = config.CONCURRENCY.default
    lease_seconds: float = config.LEASE_SECONDS.default
    poll_interval: float = config.POLL_INTERVAL.default
    listen: bool = config.LISTEN.default
    grace_seconds: float = config.GRACE.default
    drain: bool = config.DRAIN.default
    max_attempts: int = config.MAX_ATTEMPTS.default
    backoff_base: float = config.BACKOFF_BASE.default
    backoff_max: float = config.BACKOFF_MAX.default
    retention_seconds: float | None = config.RETENTION.default
    feedback_provider_days: float = config.FEEDBACK_PROVIDER_DAYS.default
    priorities: tuple[config.KindPriority, ...] = config.PRIORITIES.default
    quota_rate: float | None = config.QUOTA.default
    quota_burst: int | None = config.QUOTA_BURST.default
    quota_account: str | None = config.QUOTA_ACCOUNT.default
    worker_id: str = field(default_factory=default_worker_id)

    def __post_init__(self) -> None:
        if not self.kinds:
            raise ConfigurationError("at least one message kind is needed")
        bad = [k for k in self.kinds if not re.fullmatch(KIND_PATTERN, k)]
        if bad:
            raise ConfigurationError(
                f"invalid kind {bad[0]!r}: kinds are lower-case identifiers like otp or invite"
            )
        if len(set(self.kinds)) != len(self.kinds):
            raise ConfigurationError("the kind list names a kind twice")
        validate_schema_name(self.schema)
        _at_least("concurrency", self.concurrency, 1)
        _at_least("batch size", self.batch_size, 1)
        _at_least("max attempts", self.max_attempts, 1)
        _at_least("lease", self.lease_seconds, 1.0)
        _positive("poll interval", self.poll_interval)
        _positive("backoff base", self.backoff_base)
        _at_least("grace", self.grace_seconds, 0.0)
        _positive("provider suppression", self.feedback_provider_days)
        if self.backoff_max < self.backoff_base:
            raise ConfigurationError("the backoff maximum must be at least the backoff base")
        if self.retention_seconds is not None:
            _retention(self.retention_seconds)
        named = [p.kind for p in self.priorities]
        strange = [k for k in named if k not in self.kinds]
        if strange:
            raise ConfigurationError(
                f"a priority names kind {strange[0]!r}, which this worker does not claim"
            )
        if len(set(named)) != len(named):
            raise ConfigurationError("the priorities name a kind twice")
        for entry in self.priorities:
            if entry.aging_seconds is not None:
                _positive(f"aging of {entry.kind}", entry.aging_seconds)
        if self.quota_rate is None:
            if self.quota_burst is not None or self.quota_account is not None:
                raise ConfigurationError("a quota burst or account needs a quota rate")
        else:
            _positive("quota", self.quota_rate)
            if self.quota_burst is not None:
                _at_least("quota burst", self.quota_burst, 1)
            if not self.quota_account or len(self.quota_account) > 200:
                raise ConfigurationError("the quota account must have 1 to 200 characters")
        if not self.worker_id or len(self.worker_id) > 200:
            raise ConfigurationError("the worker id must have 1 to 200 characters")

    @property
    def capacity(self) -> int:
        """Rows held for sending at once: those sending, plus a batch waiting for a slot.

        Rows whose outcome the worker knows but has not written yet hold no slot; up to a batch
        of them is held beyond this, so a worker holds at most `capacity + batch_size` rows.
        """
        return self.concurrency + self.batch_size

    @property
    def priority_of(self) -> dict[str, int]:
        """Each claimed kind's priority (0 unless given)."""
        given = {p.kind: p.priority for p in self.priorities}
        return {kind: given.get(kind, 0) for kind in self.kinds}

    @property
    def aging_of(self) -> dict[str, float]:
        """Each claimed kind's aging in seconds (`DEFAULT_AGING_SECONDS` unless given)."""
        given = {p.kind: p.aging_seconds for p in self.priorities}
        return {kind: given.get(kind) or DEFAULT_AGING_SECONDS for kind in self.kinds}

    @property
    def burst(self) -> int:
        """The quota's burst, with its default (a second's worth of tokens, at least 1)."""
        if self.quota_burst is not None:
            return self.quota_burst
        return max(1, math.ceil(self.quota_rate or 1.0))

    @property
    def extend_interval(self) -> float:
        """How often held leases are checked; a lease is extended once half of it is gone."""
        return max(0.1, self.lease_seconds / 4)

    @property
    def sweep_interval(self) -> float:
        """How often expired leases are reclaimed and expired OTPs dead-lettered."""
        return min(15.0, max(0.5, self.lease_seconds / 3))


def _retention(seconds: float) -> None:
    if not seconds >= DEFAULT_RECEIPT_TTL_SECONDS:
        raise ConfigurationError(
            f"the retention must be at least a day (the receipt TTL), got {seconds:g}s: a "
            "request retried after its message was dropped would be sent again (for a "
            "shorter one, run `leasebox prune --allow-short-retention` yourself)"
        )
    if seconds > MAX_RETENTION_SECONDS:
        raise ConfigurationError(
            f"the retention must be at most 36500d (a hundred years), got {seconds:g}s; "
            "leave it unset to keep everything"
        )


def _at_least(name: str, value: float, minimum: float) -> None:
    if not value >= minimum:
        raise ConfigurationError(f"the {name} must be at least {minimum:g}, got {value:g}")


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigurationError(f"the {name} must be positive, got {value:g}")
