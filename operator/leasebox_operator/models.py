"""The `OutboxWorkerPool` resource as pydantic models: the single source of its schema.

The CRD in `crds/` is generated from these classes (`leasebox_operator.crd`), and the
operator validates every spec it reads with them, so the API server and the operator agree
on what a pool is. Python names are snake_case; the resource speaks camelCase through
aliases. Rules that relate two fields (`minReplicas <= maxReplicas`) are declared once as
`CelRule`s: the CRD carries them as `x-kubernetes-validations`, and the model checks the
same predicate, so a cluster without CEL (or a test without a cluster) rejects the same
specs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from leasebox.messages import KIND_PATTERN

GROUP = "leasebox.dev"
VERSION = "v1alpha1"
KIND = "OutboxWorkerPool"
PLURAL = "outboxworkerpools"
SINGULAR = "outboxworkerpool"
SHORT_NAMES = ("owp",)
API_VERSION = f"{GROUP}/{VERSION}"

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DATA_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
SQL_IDENTIFIER = r"^[a-z_][a-z0-9_]{0,62}$"
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
QUANTITY = r"^[+]?[0-9.]+([eE][-+]?[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"

Kind = Annotated[str, StringConstraints(pattern=KIND_PATTERN)]
ResourceName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
]
DataKey = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN)]
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    ),
]


@dataclass(frozen=True)
class CelRule:
    """A cross-field rule: CEL for the API server, a Python predicate for the operator."""

    rule: str
    message: str
    check: Callable[[Any], bool]

    def as_validation(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


def _cel(rules: tuple[CelRule, ...]) -> dict[str, Any]:
    return {"x-kubernetes-validations": [r.as_validation() for r in rules]}


class _Model(BaseModel):
    """camelCase on the wire, unknown fields refused, attribute docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> _Model:
        for rule in self.cel_rules:
            if not rule.check(self):
                raise ValueError(rule.message)
        return self


class SecretKeyRef(_Model):
    """A key of a Secret in the pool's namespace; only a reference, never its value."""

    name: ResourceName
    """Name of the Secret."""
    key: DataKey
    """Key inside the Secret."""


class DatabaseSecretRef(SecretKeyRef):
    """The Secret key holding the PostgreSQL DSN."""

    key: DataKey = "dsn"
    """Key inside the Secret holding the DSN."""


class ProviderSecretRef(SecretKeyRef):
    """The Secret key holding the provider URL (smtp://, https://, log://)."""

    key: DataKey = "url"
    """Key inside the Secret holding the provider URL."""


class PayloadKeysSecretRef(SecretKeyRef):
    """The Secret key holding the payload encryption keys (comma-separated Fernet keys)."""

    key: DataKey = "keys"
    """Key inside the Secret holding the keys."""


class DatabaseSpec(_Model):
    """Where the outbox lives."""

    secret_ref: DatabaseSecretRef
    """Secret holding the DSN; workers get it by reference, the operator reads it to poll."""
    schema_name: Annotated[str, StringConstraints(pattern=SQL_IDENTIFIER)] = Field(
        "leasebox", alias="schema"
    )
    """PostgreSQL schema holding the leasebox tables."""


class ProviderSpec(_Model):
    """How workers send mail."""

    secret_ref: ProviderSecretRef
    """Secret holding the provider URL."""


class SLASpec(_Model):
    """The promise the pool is scaled to keep."""

    oldest_pending_age_seconds: float = Field(60.0, gt=0, le=86400)
    """Age, from creation, the oldest pending message may reach."""


class ScalingSpec(_Model):
    """How the operator sizes the worker Deployment."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "self.minReplicas <= self.maxReplicas",
            "minReplicas must not exceed maxReplicas",
            lambda s: s.min_replicas <= s.max_replicas,
        ),
    )
    model_config = ConfigDict(json_schema_extra=_cel(cel_rules))

    min_replicas: int = Field(1, ge=0, le=1000)
    """Fewest workers; 0 lets an idle pool scale to zero."""
    max_replicas: int = Field(10, ge=1, le=1000)
    """Most workers."""
    poll_interval_seconds: float = Field(5.0, ge=0.1, le=3600)
    """How often the backlog is read and the replicas decided."""
    scale_down_stabilization_seconds: float = Field(120.0, ge=0, le=86400)
    """A scale-down goes only to the highest recommendation made within this window."""
    max_scale_up_step: int | None = Field(None, ge=1, le=1000)
    """Most pods one decision adds; unset is unbounded."""
    max_scale_down_step: int | None = Field(None, ge=1, le=1000)
    """Most pods one decision removes; unset is unbounded."""
    initial_worker_throughput: float = Field(50.0, gt=0, le=100000)
    """Messages per second one worker is assumed to send until it has been measured."""
    startup_seconds: float = Field(20.0, ge=0, le=3600)
    """Expected delay between asking for a pod and its first send."""
    backlog_budget_fraction: float = Field(0.5, gt=0, lt=1)
    """Fraction of the SLA the ready backlog may spend waiting."""


class ResourceRequirements(_Model):
    """Compute resources of a worker container."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Requested resources, e.g. cpu: 100m."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Resource limits, e.g. memory: 256Mi."""


def _default_resources() -> ResourceRequirements:
    return ResourceRequirements(
        requests={"cpu": "100m", "memory": "128Mi"}, limits={"memory": "256Mi"}
    )


class WorkerSpec(_Model):
    """The worker pods."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "self.backoffBaseSeconds <= self.backoffMaxSeconds",
            "backoffBaseSeconds must not exceed backoffMaxSeconds",
            lambda w: w.backoff_base_seconds <= w.backoff_max_seconds,
        ),
    )
    model_config = ConfigDict(json_schema_extra=_cel(cel_rules))

    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = None
    """Worker image; unset uses the operator's default worker image."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    """Image pull policy; unset uses the Kubernetes default."""
    concurrency: int = Field(32, ge=1, le=1024)
    """In-flight sends per worker process."""
    lease_seconds: float = Field(45.0, ge=5, le=3600)
    """How long a claimed message stays leased to its worker."""
    max_attempts: int = Field(8, ge=1, le=100)
    """Attempts before a message becomes a dead letter."""
    backoff_base_seconds: float = Field(2.0, gt=0, le=3600)
    """First retry delay; it doubles per attempt."""
    backoff_max_seconds: float = Field(300.0, gt=0, le=86400)
    """Largest retry delay."""
    resources: ResourceRequirements = Field(default_factory=_default_resources)
    """Container resources."""
    templates_config_map: ResourceName | None = None
    """ConfigMap of templates that override the built-in ones, mounted into the workers."""
    payload_keys_secret_ref: PayloadKeysSecretRef | None = None
    """Secret holding the payload encryption keys."""
    log_format: Literal["json", "text"] = "json"
    """Worker log format."""
    service_account_name: ResourceName | None = None
    """Service account of the worker pods; unset uses the namespace default."""


class MonitoringSpec(_Model):
    """Prometheus Operator objects the operator creates for the pool."""

    pod_monitor: bool = False
    """Create a PodMonitor scraping the workers (needs the PodMonitor CRD)."""
    prometheus_rule: bool = False
    """Create a PrometheusRule with the pool's SLA alerts (needs the PrometheusRule CRD)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels on both, e.g. the label your Prometheus selects rules by."""


# The API server fills an absent section with `{}` and then the section's own defaults.
_EMPTY_DEFAULT: dict[str, Any] = {"default": {}}


class PoolSpec(_Model):
    """A pool of outbox workers for some message kinds, scaled to meet an SLA."""

    kinds: list[Kind] = Field(
        min_length=1, max_length=64, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Message kinds the pool's workers claim, e.g. otp."""
    database: DatabaseSpec
    """The outbox database."""
    provider: ProviderSpec
    """The mail provider."""
    sla: SLASpec = Field(default_factory=SLASpec, json_schema_extra=_EMPTY_DEFAULT)
    """The delivery SLA."""
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, json_schema_extra=_EMPTY_DEFAULT)
    """Scaling bounds and tuning."""
    worker: WorkerSpec = Field(default_factory=WorkerSpec, json_schema_extra=_EMPTY_DEFAULT)
    """The worker pods."""
    paused: bool = False
    """Freeze the replica count; the backlog is still observed and reported."""
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec, json_schema_extra=_EMPTY_DEFAULT
    )
    """Prometheus Operator integration."""

    @field_validator("kinds")
    @classmethod
    def _unique_kinds(cls, kinds: list[str]) -> list[str]:
        if len(set(kinds)) != len(kinds):
            raise ValueError("kinds must not repeat")
        return kinds


class Condition(_Model):
    """A condition shaped like `metav1.Condition`."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=316)]
    """Ready, DatabaseReachable, SLAMet, ScalingLimited or Paused."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    observed_generation: int | None = Field(None, ge=0)
    """The spec generation the condition was computed from."""
    last_transition_time: datetime
    """When the status last changed."""
    reason: Annotated[
        str, StringConstraints(min_length=1, max_length=1024, pattern=CONDITION_REASON)
    ]
    """A CamelCase reason."""
    message: Annotated[str, StringConstraints(max_length=32768)]
    """A sentence for people."""


class BacklogStatus(_Model):
    """The backlog of the pool's kinds at the last poll."""

    pending: int = Field(0, ge=0)
    """Pending messages, including those waiting in backoff."""
    ready: int = Field(0, ge=0)
    """Pending messages claimable now."""
    processing: int = Field(0, ge=0)
    """Messages leased to a worker."""
    dead: int = Field(0, ge=0)
    """Dead letters."""
    expired_leases: int = Field(0, ge=0)
    """Leases that expired without completion (their worker died)."""
    oldest_pending_age_seconds: float = Field(0.0, ge=0)
    """Age of the oldest pending message, from creation (the SLA clock)."""
    oldest_ready_age_seconds: float = Field(0.0, ge=0)
    """How long the oldest ready message has been claimable."""


class RatesStatus(_Model):
    """Recent message rates."""

    arrival_per_second: float = Field(0.0, ge=0)
    """Messages created per second."""
    sent_per_second: float = Field(0.0, ge=0)
    """Messages sent per second."""


class PoolStatus(_Model):
    """What the operator observed and did."""

    observed_generation: int | None = Field(None, ge=0)
    """The spec generation last reconciled."""
    replicas: int | None = Field(None, ge=0)
    """Replicas requested on the worker Deployment."""
    ready_replicas: int | None = Field(None, ge=0)
    """Worker pods ready."""
    desired_replicas: int | None = Field(None, ge=0)
    """Replicas the scaling policy asks for."""
    backlog: BacklogStatus | None = None
    """The backlog at the last poll."""
    rates: RatesStatus | None = None
    """Message rates at the last poll."""
    last_scale_time: datetime | None = None
    """When the operator last changed the replicas."""
    last_scale_reason: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """Why it did."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    """Ready, DatabaseReachable, SLAMet, ScalingLimited and Paused."""


def cel_rules() -> dict[str, tuple[CelRule, ...]]:
    """Every cross-field rule by the model that declares it (tests check the CRD has them)."""
    return {m.__name__: m.cel_rules for m in (ScalingSpec, WorkerSpec) if m.cel_rules}
