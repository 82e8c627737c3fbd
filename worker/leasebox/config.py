"""The worker's configuration contract: one table of every setting a person can give it.

Each `Option` names its field, its `LEASEBOX_*` variable, how its text is read, its default
and its help. That one table builds the `leasebox worker` flags, reads the environment (a
flag wins over its variable), gives `WorkerSettings` and `ProcessConfig` their defaults,
and renders the env the operator writes into a pool's Deployment, so the names the operator
writes and the names the worker reads cannot drift apart, and each default is written once.

It sits low (beside `db`, below the runtime and the operator) and does no I/O, so that the
operator reads the worker's vocabulary without importing the worker. The validated value the
runtime runs on is `leasebox.runtime.settings.WorkerSettings`, built from this table.

Values are read here rather than by argparse so that a bad one, from either source, is one
`ConfigurationError` line naming where it came from (`LEASEBOX_CONCURRENCY must be a whole
number, got 'many'`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from leasebox.db.queries import DEFAULT_SCHEMA, validate_schema_name
from leasebox.errors import ConfigurationError
from leasebox.messages import BUILTIN_KINDS

T = TypeVar("T")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# The event loops a worker may run on (`leasebox.runtime.event_loops` makes them).
AUTO = "auto"
ASYNCIO = "asyncio"
UVLOOP = "uvloop"
EVENT_LOOPS = (AUTO, ASYNCIO, UVLOOP)


class Target(StrEnum):
    """Which value an option configures."""

    SETTINGS = "settings"
    """`WorkerSettings`: how the runtime claims, sends and settles."""
    PROCESS = "process"
    """The process around it: provider, templates, metrics server, logs."""


class Style(StrEnum):
    """How an option looks on the command line."""

    VALUE = "value"
    """`--flag VALUE`."""
    SWITCH = "switch"
    """`--flag` sets it; the variable takes true or false."""
    NEGATED = "negated"
    """`--no-flag` turns off a setting that is on by default."""


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("a whole number") from None


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("a number") from None
    if not math.isfinite(value):
        raise ValueError("a finite number")
    return value


def duration(text: str) -> float:
    """Seconds in `90`, `90s`, `15m`, `1h`, `7d` or `2w`."""
    match = _DURATION.fullmatch(text.lower())
    if not match:
        raise ValueError("a duration such as 90s, 15m, 1h or 7d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def text(value: str) -> str:
    return value


def rate(text: str) -> float:
    """Messages per second in `14`, `14/s`, `600/m`, `50000/d` or `100/10s`."""
    count, _, period = text.partition("/")
    messages = number(count)
    seconds = duration(period if period[:1].isdigit() else f"1{period}") if period else 1.0
    if not messages > 0 or not seconds > 0:
        raise ValueError("a positive rate such as 14/s, 600/m or 50000/d")
    return messages / seconds


def kinds(value: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in value.split(",") if k.strip())


class KindPriority(NamedTuple):
    """A kind's priority in the claim (higher first) and its aging: after waiting this many
    seconds from creation (its SLA) a message of it is served before higher priorities."""

    kind: str
    priority: int
    aging_seconds: float | None = None

    def __str__(self) -> str:
        aging = "" if self.aging_seconds is None else f"/{self.aging_seconds:g}s"
        return f"{self.kind}={self.priority}{aging}"


def priorities(value: str) -> tuple[KindPriority, ...]:
    """`otp=10/30s,verification=0/10m`: each kind's priority, and optionally its aging."""
    found = []
    for item in (i.strip() for i in value.split(",")):
        if not item:
            continue
        kind, equals, rest = item.partition("=")
        number, slash, aging = rest.partition("/")
        if not equals or not kind.strip():
            raise ValueError("kind=priority pairs such as otp=10,verification=0/10m")
        try:
            priority = int(number)
        except ValueError:
            raise ValueError(f"a whole number as the priority of {kind.strip()}") from None
        found.append(KindPriority(kind.strip(), priority, duration(aging) if slash else None))
    return tuple(found)


def switch(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("true or false")


def event_loop_choice(value: str) -> str:
    """`auto`, `asyncio` or `uvloop`, whatever the case and spacing."""
    chosen = value.strip().lower()
    if chosen not in EVENT_LOOPS:
        raise ValueError(", ".join(EVENT_LOOPS[:-1]) + f" or {EVENT_LOOPS[-1]}")
    return chosen


def schema(value: str) -> str:
    return validate_schema_name(value)


def directory(value: str) -> Path:
    return Path(value)


@dataclass(frozen=True)
class Option(Generic[T]):
    """One setting: `field` of its target, `variable` in the environment, `--flag` by name."""

    field: str
    variable: str
    parse: Callable[[str], T]
    default: T
    help: str
    target: Target = Target.SETTINGS
    style: Style = Style.VALUE
    metavar: str | None = None
    attribute: str = ""
    """The target's attribute, when it is not named like the flag (`grace_seconds`)."""

    @property
    def name(self) -> str:
        """The attribute of `WorkerSettings` or `ProcessConfig` this option sets."""
        return self.attribute or self.field

    @property
    def flag(self) -> str:
        name = self.field.replace("_", "-")
        return f"--no-{name}" if self.style is Style.NEGATED else f"--{name}"

    @property
    def dest(self) -> str:
        """The argparse destination of the flag."""
        return self.flag.lstrip("-").replace("-", "_")

    def render(self, value: T) -> str:
        """`value` as the text of its variable (what the operator writes into a pod's env)."""
        if self.style is Style.NEGATED:
            return "false" if value else "true"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)


KINDS = Option[tuple[str, ...]](
    "kinds", "LEASEBOX_KINDS", kinds, BUILTIN_KINDS, "comma-separated kinds to claim"
)
SCHEMA = Option("schema", "LEASEBOX_SCHEMA", schema, DEFAULT_SCHEMA, "schema of the tables")
PROVIDER = Option(
    "provider",
    "LEASEBOX_PROVIDER_URL",
    text,
    "",
    "provider URL (required): smtp://, smtps://, http(s)://, a mail service (ses://, "
    "sendgrid://, postmark://, mailgun://, resend://), log://, null://, or a scheme of the "
    "leasebox.providers entry-point group",
    Target.PROCESS,
    attribute="provider_url",
)
PROVIDER_TIMEOUT = Option(
    "provider_timeout",
    "LEASEBOX_PROVIDER_TIMEOUT",
    number,
    10.0,
    "seconds a provider call may take",
    Target.PROCESS,
)
TEMPLATES = Option[Path | None](
    "templates",
    "LEASEBOX_TEMPLATES",
    directory,
    None,
    "directory whose templates override the built-ins file by file, and add others",
    Target.PROCESS,
    metavar="DIR",
    attribute="templates_dir",
)
CONCURRENCY = Option(
    "concurrency", "LEASEBOX_CONCURRENCY", whole_number, 32, "sends in flight at once"
)
BATCH_SIZE = Option[int | None](
    "batch_size",
    "LEASEBOX_BATCH_SIZE",
    whole_number,
    None,
    "most rows per claim statement (default: the concurrency)",
)
LEASE_SECONDS = Option(
    "lease_seconds",
    "LEASEBOX_LEASE_SECONDS",
    number,
    45.0,
    "lease length, seconds; a send running past half of it extends it",
)
POLL_INTERVAL = Option(
    "poll_interval",
    "LEASEBOX_POLL_INTERVAL",
    number,
    1.0,
    "longest idle wait between claims, seconds; LISTEN/NOTIFY wakes a worker sooner",
)
LISTEN = Option(
    "listen",
    "LEASEBOX_NO_LISTEN",
    switch,
    True,
    "do not LISTEN for new rows; poll only",
    style=Style.NEGATED,
)
GRACE = Option(
    "grace",
    "LEASEBOX_GRACE",
    number,
    30.0,
    "seconds in-flight sends may take after SIGTERM; unsent leases are released at once",
    attribute="grace_seconds",
)
DRAIN = Option(
    "drain",
    "LEASEBOX_DRAIN",
    switch,
    False,
    "exit once nothing is ready (batch jobs, benchmarks)",
    style=Style.SWITCH,
)
MAX_ATTEMPTS = Option(
    "max_attempts",
    "LEASEBOX_MAX_ATTEMPTS",
    whole_number,
    8,
    "attempt limit for rows without their own",
)
BACKOFF_BASE = Option(
    "backoff_base", "LEASEBOX_BACKOFF_BASE", number, 2.0, "first retry delay, seconds"
)
BACKOFF_MAX = Option(
    "backoff_max", "LEASEBOX_BACKOFF_MAX", number, 300.0, "longest retry delay, seconds"
)
METRICS_PORT = Option(
    "metrics_port",
    "LEASEBOX_METRICS_PORT",
    whole_number,
    9108,
    "port of /metrics, /healthz (the event loop is alive) and /readyz (database and "
    "provider reachable, with the reason); 0 = off",
    Target.PROCESS,
)
METRICS_HOST = Option(
    "metrics_host",
    "LEASEBOX_METRICS_HOST",
    text,
    "0.0.0.0",  # noqa: S104 - the pod's metrics port is meant to be scraped
    "address /metrics, /healthz and /readyz bind: every IPv4 interface (a pod's IP, for "
    "Prometheus and the kubelet); 127.0.0.1 on a shared host, :: for IPv6",
    Target.PROCESS,
)
LOG_FORMAT = Option[str | None](
    "log_format",
    "LEASEBOX_LOG_FORMAT",
    text,
    None,
    "json or text (default: text at a terminal, else json)",
    Target.PROCESS,
)
LOG_LEVEL = Option(
    "log_level",
    "LEASEBOX_LOG_LEVEL",
    text,
    "info",
    "debug, info, warning or error",
    Target.PROCESS,
)
EVENT_LOOP = Option(
    "event_loop",
    "LEASEBOX_EVENT_LOOP",
    event_loop_choice,
    AUTO,
    "auto (uvloop when installed, else asyncio), uvloop or asyncio",
    Target.PROCESS,
)
RETENTION = Option[float | None](
    "retention",
    "LEASEBOX_RETENTION",
    duration,
    None,
    "hourly, drop the days of sent messages, their history and expired receipts older than "
    "this, e.g. 7d; at least a day (default: keep everything; prune by hand)",
    metavar="DURATION",
    attribute="retention_seconds",
)
FEEDBACK_PROVIDER_DAYS = Option(
    "feedback_provider_days",
    "LEASEBOX_FEEDBACK_PROVIDER_DAYS",
    number,
    30.0,
    "days a provider's own refusal of a suppressed address (Postmark's 406) keeps the "
    "mailbox on the suppression list; the feedback receiver reads the same variable",
    metavar="DAYS",
)
PRIORITIES = Option[tuple[KindPriority, ...]](
    "priorities",
    "LEASEBOX_PRIORITIES",
    priorities,
    (),
    "kinds claimed first, and after how long a waiting message of a lower one goes ahead "
    "anyway (its SLA): otp=10/30s,verification=0/10m; unlisted kinds are 0, aging 60s "
    "(default: none, oldest first)",
    metavar="KIND=N[/SLA],...",
)
QUOTA = Option[float | None](
    "quota",
    "LEASEBOX_QUOTA",
    rate,
    None,
    "the provider account's send quota, shared through the database by every worker that "
    "sends through the account: messages per period, e.g. 14/s, 600/m, 50000/d "
    "(default: none)",
    metavar="RATE",
    attribute="quota_rate",
)
QUOTA_BURST = Option[int | None](
    "quota_burst",
    "LEASEBOX_QUOTA_BURST",
    whole_number,
    None,
    "messages the quota lets out at once after an idle spell (default: a second's worth, "
    "at least 1)",
)
QUOTA_ACCOUNT = Option[str | None](
    "quota_account",
    "LEASEBOX_QUOTA_ACCOUNT",
    text,
    None,
    "the provider account the quota is for; workers naming the same account share it "
    "(default: the provider URL without credentials or options)",
)
WORKER_ID = Option[str | None](
    "worker_id",
    "LEASEBOX_WORKER_ID",
    text,
    None,
    "name recorded in leased_by and logs (default: hostname-pid)",
)

OPTIONS: tuple[Option[Any], ...] = (
    KINDS,
    SCHEMA,
    PROVIDER,
    PROVIDER_TIMEOUT,
    TEMPLATES,
    CONCURRENCY,
    BATCH_SIZE,
    LEASE_SECONDS,
    POLL_INTERVAL,
    LISTEN,
    GRACE,
    DRAIN,
    MAX_ATTEMPTS,
    BACKOFF_BASE,
    BACKOFF_MAX,
    METRICS_PORT,
    METRICS_HOST,
    LOG_FORMAT,
    LOG_LEVEL,
    EVENT_LOOP,
    RETENTION,
    FEEDBACK_PROVIDER_DAYS,
    PRIORITIES,
    QUOTA,
    QUOTA_BURST,
    QUOTA_ACCOUNT,
    WORKER_ID,
)
BY_NAME: Mapping[str, Option[Any]] = {option.name: option for option in OPTIONS}


def read(
    option: Option[T], flags: Mapping[str, object], environ: Mapping[str, str]
) -> tuple[T, str]:
    """The value of `option` and where it came from: its flag, else its variable, else the
    default. A malformed value is a `ConfigurationError` naming that source."""
    given = flags.get(option.dest)
    if given is not None and given is not False:
        if option.style is not Style.VALUE:
            return (option.style is Style.SWITCH), option.flag  # type: ignore[return-value]
        source, raw = option.flag, str(given)
    else:
        source, raw = option.variable, environ.get(option.variable, "").strip()
        if not raw and option.style is Style.VALUE:
            return option.default, source
    try:
        value = option.parse(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{source} must be {exc}, got {raw!r}") from None
    except ConfigurationError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None
    if option.style is Style.NEGATED:
        return (not value), source  # type: ignore[return-value]
    return value, source


def environment(values: Mapping[str, object]) -> list[tuple[str, str]]:
    """`(variable, text)` for each setting in `values` (by attribute name, as in
    `WorkerSettings`): the env that configures a worker with those values."""
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise KeyError(f"not worker settings: {', '.join(unknown)}")
    return [(BY_NAME[name].variable, BY_NAME[name].render(value)) for name, value in values.items()]
