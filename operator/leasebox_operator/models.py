"""The `OutboxWorkerPool` resource as pydantic models: the single source of its schema.

The CRD in `crds/` is generated from these classes (`leasebox_operator.crd`), and the
operator validates every spec it reads with them, so the API server and the operator agree
on what a pool is. Python names are snake_case; the resource speaks camelCase through
aliases. Spec numbers are integers (seconds, percents, counts), as the API conventions
ask; rules that relate fields are `CelRule`s, carried by the CRD and checked here alike.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints, field_validator

from leasebox import config
from leasebox.db.connections import DSN_VARIABLES
from leasebox.messages import KIND_PATTERN
from leasebox.producer.payload_crypto import KEYS_VARIABLE
from leasebox_operator.model_base import CelRule, Model, Quantity, ResourceName, cel
from leasebox_operator.pod_fields import EnvFromSource, EnvVar, PodTemplate, VolumeMount

GROUP = "leasebox.dev"
VERSION = "v1alpha1"
KIND = "OutboxWorkerPool"
PLURAL = "outboxworkerpools"
SINGULAR = "outboxworkerpool"
SHORT_NAMES = ("owp",)
API_VERSION = f"{GROUP}/{VERSION}"

DATA_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
QUOTA_ACCOUNT = r"^[!-~]+$"  # printable ASCII, no spaces
MAX_QUOTA_PER_SECOND = 100_000
SQL_IDENTIFIER = r"^[a-z_][a-z0-9_]{0,62}$"
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_NAME_LENGTH = 56  # leaves room for "-worker" in a 63-character label value
TEMPLATES_DIR = "/etc/leasebox/templates"
# The worker settings the operator decides from a pool's spec (`children.worker_env`), from
# the worker's own table, so the names it writes are the names the worker reads.
OPERATOR_SETTINGS = (
    config.SCHEMA, config.KINDS, config.CONCURRENCY, config.LEASE_SECONDS, config.GRACE,
    config.MAX_ATTEMPTS, config.BACKOFF_BASE, config.BACKOFF_MAX, config.METRICS_PORT,
    config.LOG_FORMAT, config.TEMPLATES, config.RETENTION, config.QUOTA,
    config.QUOTA_BURST, config.QUOTA_ACCOUNT, config.PRIORITIES,
)  # fmt: skip
# Secrets reach the worker by reference under these names.
DSN_VARIABLE = DSN_VARIABLES[0]
PROVIDER_VARIABLE = config.PROVIDER.variable
PAYLOAD_KEYS_VARIABLE = KEYS_VARIABLE
# Names the operator gives the worker container and pod; a pool may not take them.
RESERVED_ENV = (
    DSN_VARIABLE,
    PROVIDER_VARIABLE,
    *(option.variable for option in OPERATOR_SETTINGS),
    PAYLOAD_KEYS_VARIABLE,
)
RESERVED_VOLUMES = ("tmp", "templates")
RESERVED_MOUNT_PATHS = ("/tmp", TEMPLATES_DIR)  # noqa: S108 (an emptyDir)
RESERVED_LABELS = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
    "leasebox.dev/pool",
)  # fmt: skip

Kind = Annotated[str, StringConstraints(pattern=KIND_PATTERN, max_length=63)]
DataKey = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN)]


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


# Rules on the whole object: CEL sees `self.metadata.name` at the root of a CRD.
POOL_RULES: tuple[CelRule, ...] = (
    CelRule(
        f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        f"metadata.name: at most {MAX_NAME_LENGTH} characters (it names the worker "
        "Deployment and labels its pods)",
        lambda body: len(str((body.get("metadata") or {}).get("name") or "")) <= MAX_NAME_LENGTH,
    ),
)


class SecretKeyRef(Model):
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


class DatabaseSpec(Model):
    """Where the outbox lives, and who migrates its schema."""

    secret_ref: DatabaseSecretRef
    """Secret holding the DSN; workers get it by reference, the operator reads it to poll."""
    schema_name: Annotated[str, StringConstraints(pattern=SQL_IDENTIFIER)] = Field(
        config.SCHEMA.default, alias="schema"
    )
    """PostgreSQL schema holding the leasebox tables."""
    migrations: Literal["Auto", "Manual"] = "Auto"
    """Auto: every worker pod runs `leasebox migrate` in an init container before it starts
    (an advisory lock serialises concurrent runs). Manual: you migrate in your own pipeline;
    the pool reports SchemaMissing or SchemaOutdated until you do."""
    retention_days: int | None = Field(None, ge=1, le=36500)
    """Days of sent messages, their attempt history and expired receipts kept: the workers
    drop older days hourly, a day partition at a time. Unset keeps everything (run
    `leasebox prune` yourself). It applies to the whole schema: pools sharing one should
    give the same value, as the shortest wins. At least 1, the receipt TTL; set it above
    your producers' receipt TTL if they use a longer one."""


class QuotaSpec(Model):
    """The provider account's send quota, shared through the database by every worker of
    every pool that names the same account (Amazon SES starts at 14 messages a second)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.burst) || self.burst <= self.messages",
            "burst must not exceed messages: the quota keeps at most one period's worth",
            lambda q: q.burst is None or q.burst <= q.messages,
        ),
        CelRule(
            "self.messages <= 100000 * self.perSeconds",
            "the quota must be at most 100000 messages a second",
            lambda q: q.messages <= MAX_QUOTA_PER_SECOND * q.per_seconds,
        ),
    )
    model_config = cel(cel_rules)

    messages: int = Field(ge=1, le=1_000_000_000)
    """Messages the account may send per period."""
    per_seconds: int = Field(1, ge=1, le=86400)
    """The period, in seconds: 1 for a rate a second, 60 a minute, 86400 a day."""
    burst: int | None = Field(None, ge=1, le=1_000_000_000)
    """Messages the quota lets out at once after an idle spell; unset: a second's worth."""
    account: Annotated[str, StringConstraints(pattern=QUOTA_ACCOUNT, max_length=200)] | None = None
    """The provider account's name: pools naming the same account share its quota. Unset:
    the provider URL without its credentials and options (pools with the same URL share)."""

    @property
    def per_second(self) -> float:
        return self.messages / self.per_seconds


class ProviderSpec(Model):
    """How workers send mail."""

    secret_ref: ProviderSecretRef
    """Secret holding the provider URL."""
    quota: QuotaSpec | None = None
    """The account's send quota: enforced across the workers, and the most the operator
    scales the pool for."""


class SLASpec(Model):
    """The promise the pool is scaled to keep."""

    oldest_pending_age_seconds: int = Field(60, ge=1, le=86400)
    """Age in seconds, from creation, the oldest pending message may reach."""


class ScalingSpec(Model):
    """How the worker Deployment is sized."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "self.minReplicas <= self.maxReplicas",
            "minReplicas must not exceed maxReplicas",
            lambda s: s.min_replicas <= s.max_replicas,
        ),
    )
    model_config = cel(cel_rules)

    mode: Literal["Operator", "External"] = "Operator"
    """Operator: the operator sizes the pool to meet its SLA. External: an HPA or a KEDA
    ScaledObject (or `kubectl scale`) sets spec.replicas through the pool's scale
    subresource; the operator applies it within min/max and still reports the backlog."""
    min_replicas: int = Field(1, ge=0, le=1000)
    """Fewest workers; 0 lets an idle pool scale to zero."""
    max_replicas: int = Field(10, ge=1, le=1000)
    """Most workers."""
    poll_interval_seconds: int = Field(5, ge=1, le=3600)
    """Seconds between backlog reads and scaling decisions."""
    scale_down_stabilization_seconds: int = Field(120, ge=0, le=86400)
    """A scale-down goes only to the highest recommendation made within this many seconds."""
    max_scale_up_step: int | None = Field(None, ge=1, le=1000)
    """Most pods one decision adds; unset is unbounded."""
    max_scale_down_step: int | None = Field(None, ge=1, le=1000)
    """Most pods one decision removes; unset is unbounded."""
    initial_worker_throughput: int = Field(50, ge=1, le=100000)
    """Messages per second one worker is assumed to send until it has been measured."""
    startup_seconds: int = Field(20, ge=0, le=3600)
    """Expected seconds between asking for a pod and its first send."""
    backlog_budget_percent: int = Field(50, ge=1, le=99)
    """Percent of the SLA the ready backlog may spend waiting."""


class ResourceRequirements(Model):
    """Compute resources of a worker container."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Requested resources, e.g. cpu: 100m."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Resource limits, e.g. memory: 256Mi."""


def _default_resources() -> ResourceRequirements:
    return ResourceRequirements(
        requests={"cpu": "100m", "memory": "128Mi"}, limits={"memory": "256Mi"}
    )


def _env_free(worker: WorkerSpec) -> bool:
    return all(e.name not in RESERVED_ENV for e in worker.env or ())


def _mounts_known(worker: WorkerSpec) -> bool:
    spec = worker.pod_template.spec if worker.pod_template else None
    volumes = {v.name for v in (spec.volumes if spec and spec.volumes else ())}
    return all(m.name in volumes for m in worker.volume_mounts or ())


def _names_free(worker: WorkerSpec) -> bool:
    template = worker.pod_template
    volumes = template.spec.volumes if template and template.spec else None
    labels = template.metadata.labels if template and template.metadata else None
    return (
        all(v.name not in RESERVED_VOLUMES for v in volumes or ())
        and all(m.mount_path not in RESERVED_MOUNT_PATHS for m in worker.volume_mounts or ())
        and all(key not in RESERVED_LABELS for key in labels or {})
    )


_VOLUMES = "self.podTemplate.spec.volumes"
_HAS_VOLUMES = f"has(self.podTemplate) && has(self.podTemplate.spec) && has({_VOLUMES})"
_LABELS = "self.podTemplate.metadata.labels"


class WorkerSpec(Model):
    """The worker pods. Their defaults are the worker's own (`leasebox.config`), in whole
    seconds, so a pool that sets nothing runs a worker as `leasebox worker` would."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "self.backoffBaseSeconds <= self.backoffMaxSeconds",
            "backoffBaseSeconds must not exceed backoffMaxSeconds",
            lambda w: w.backoff_base_seconds <= w.backoff_max_seconds,
        ),
        CelRule(
            f"!has(self.env) || self.env.all(e, !(e.name in {_cel_list(RESERVED_ENV)}))",
            "env must not set a variable the operator sets (LEASEBOX_DSN, LEASEBOX_KINDS, ...): "
            "use the pool's own fields for them",
            _env_free,
        ),
        CelRule(
            f"!has(self.volumeMounts) || self.volumeMounts.all(m, {_HAS_VOLUMES} && "
            f"{_VOLUMES}.exists(v, v.name == m.name))",
            "every volumeMounts[].name must name a volume of podTemplate.spec.volumes",
            _mounts_known,
        ),
        CelRule(
            f"(!has(self.volumeMounts) || self.volumeMounts.all(m, !(m.mountPath in "
            f"{_cel_list(RESERVED_MOUNT_PATHS)}))) && (!({_HAS_VOLUMES}) || {_VOLUMES}.all(v, "
            f"!(v.name in {_cel_list(RESERVED_VOLUMES)}))) && (!has(self.podTemplate) || "
            f"!has(self.podTemplate.metadata) || !has({_LABELS}) || {_LABELS}.all(k, "
            f"!(k in {_cel_list(RESERVED_LABELS)})))",
            "the volumes tmp and templates, the mount paths /tmp and "
            f"{TEMPLATES_DIR} and the pod labels {', '.join(RESERVED_LABELS)} are the "
            "operator's",
            _names_free,
        ),
    )
    model_config = cel(cel_rules)

    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = None
    """Worker image; unset uses the operator's default worker image."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    """Image pull policy; unset uses the Kubernetes default."""
    concurrency: int = Field(config.CONCURRENCY.default, ge=1, le=1024)
    """In-flight sends per worker process."""
    lease_seconds: int = Field(int(config.LEASE_SECONDS.default), ge=5, le=3600)
    """Seconds a claimed message stays leased to its worker."""
    max_attempts: int = Field(config.MAX_ATTEMPTS.default, ge=1, le=100)
    """Attempts before a message becomes a dead letter."""
    backoff_base_seconds: int = Field(int(config.BACKOFF_BASE.default), ge=1, le=3600)
    """First retry delay in seconds; it doubles per attempt."""
    backoff_max_seconds: int = Field(int(config.BACKOFF_MAX.default), ge=1, le=86400)
    """Largest retry delay in seconds."""
    resources: ResourceRequirements = Field(default_factory=_default_resources)
    """Container resources (the migration init container gets the same)."""
    templates_config_map: ResourceName | None = None
    """ConfigMap of templates that override the built-in ones, mounted into the workers."""
    payload_keys_secret_ref: PayloadKeysSecretRef | None = None
    """Secret holding the payload encryption keys."""
    log_format: Literal["json", "text"] = "json"
    """Worker log format."""
    service_account_name: ResourceName | None = None
    """Service account of the worker pods; unset uses the namespace default."""
    env: Annotated[list[EnvVar], Field(max_length=64)] | None = None
    """Extra environment variables of the worker, e.g. LEASEBOX_LOG_LEVEL."""
    env_from: Annotated[list[EnvFromSource], Field(max_length=16)] | None = None
    """ConfigMaps or Secrets whose keys become environment variables of the worker."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=32)] | None = None
    """Where volumes of podTemplate.spec.volumes are mounted in the worker container."""
    pod_template: PodTemplate | None = None
    """Labels, annotations, scheduling and volumes of the worker pods (cert-manager's
    podTemplate); merged into the Deployment without loosening its security context."""


class KindPrioritySpec(Model):
    """How urgent one kind is: claimed before the kinds of a lower priority, except that a
    message of a lower priority that has waited longer than its own SLA goes ahead anyway,
    within a quarter of each claim, so that no kind starves."""

    kind: Kind
    """One of spec.kinds."""
    priority: int = Field(ge=-1000, le=1000)
    """Higher first; a kind not listed is 0."""
    sla_seconds: int | None = Field(None, ge=1, le=86400)
    """How long a message of this kind may wait, from creation, before it goes ahead of
    higher priorities; unset: spec.sla.oldestPendingAgeSeconds."""


class MonitoringSpec(Model):
    """Prometheus Operator objects the operator creates for the pool."""

    pod_monitor: bool = False
    """Create a PodMonitor scraping the workers (needs the PodMonitor CRD)."""
    prometheus_rule: bool = False
    """Create a PrometheusRule with the pool's alerts (needs the PrometheusRule CRD)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels on both, e.g. the label your Prometheus selects rules by."""


# The API server fills an absent section with `{}` and then the section's own defaults.
_EMPTY_DEFAULT: dict[str, Any] = {"default": {}}


class PoolSpec(Model):
    """A pool of outbox workers for some message kinds, scaled to meet an SLA."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.replicas) || self.scaling.mode == 'External'",
            "spec.replicas is for scaling.mode External (an HPA, KEDA or kubectl scale); in "
            "mode Operator the operator sizes the pool",
            lambda s: s.replicas is None or s.scaling.mode == "External",
        ),
        CelRule(
            "!has(self.priorities) || self.priorities.all(p, p.kind in self.kinds)",
            "every priorities[].kind must be one of spec.kinds",
            lambda s: all(p.kind in s.kinds for p in s.priorities or ()),
        ),
    )
    model_config = cel(cel_rules)

    kinds: list[Kind] = Field(
        min_length=1, max_length=64, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Message kinds the pool's workers claim, e.g. otp."""
    database: DatabaseSpec
    """The outbox database."""
    provider: ProviderSpec
    """The mail provider."""
    replicas: int | None = Field(None, ge=0, le=1000)
    """Workers wanted, set through the scale subresource in scaling.mode External."""
    sla: SLASpec = Field(default_factory=SLASpec, json_schema_extra=_EMPTY_DEFAULT)
    """The delivery SLA."""
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, json_schema_extra=_EMPTY_DEFAULT)
    """Scaling mode, bounds and tuning."""
    worker: WorkerSpec = Field(default_factory=WorkerSpec, json_schema_extra=_EMPTY_DEFAULT)
    """The worker pods."""
    priorities: (
        Annotated[
            list[KindPrioritySpec],
            Field(
                max_length=64,
                json_schema_extra={
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["kind"],
                },
            ),
        ]
        | None
    ) = None
    """Urgent kinds first: each listed kind's priority in the claim, and after how long a
    waiting message of a lower one goes ahead anyway. Unset: oldest first, whatever the kind."""
    paused: bool = False
    """Scale the workers to zero and hold them there (nothing is deleted); the backlog is
    still observed and reported. Clearing it hands the replicas back to the scaling mode."""
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


class Condition(Model):
    """A condition shaped like `metav1.Condition`."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=316)]
    """Ready, DatabaseReachable, SLAMet, ScalingLimited, QuotaSufficient, ReputationHealthy or Paused."""  # noqa: E501
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


class BacklogStatus(Model):
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
    oldest_pending_age_seconds: int = Field(0, ge=0)
    """Age in whole seconds of the oldest pending message, from creation (the SLA clock)."""
    oldest_ready_age_seconds: int = Field(0, ge=0)
    """Whole seconds the oldest ready message has been claimable."""


class RatesStatus(Model):
    """Recent message rates."""

    arrival_per_second: float = Field(0.0, ge=0)
    """Messages created per second."""
    sent_per_second: float = Field(0.0, ge=0)
    """Messages sent per second."""


class PoolStatus(Model):
    """What the operator observed and did."""

    observed_generation: int | None = Field(None, ge=0)
    """The spec generation last reconciled."""
    kinds: Annotated[str, StringConstraints(max_length=4096)] | None = None
    """The pool's kinds as one line, for `kubectl get`."""
    replicas: int | None = Field(None, ge=0)
    """Replicas requested on the worker Deployment (the scale subresource reads it)."""
    selector: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """Label selector of the worker pods (the scale subresource reads it, so does an HPA)."""
    ready_replicas: int | None = Field(None, ge=0)
    """Worker pods ready."""
    desired_replicas: int | None = Field(None, ge=0)
    """Replicas the scaling policy asks for."""
    backlog: BacklogStatus | None = None
    """The backlog at the last poll; its counts are written when they change, its ages at
    least every status heartbeat (30 s by default) while nothing else changes."""
    rates: RatesStatus | None = None
    """Message rates, written with any other change or at least every status heartbeat."""
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
    """Ready, DatabaseReachable, SLAMet, ScalingLimited, QuotaSufficient, ReputationHealthy and Paused."""  # noqa: E501


def cel_rules() -> dict[str, tuple[CelRule, ...]]:
    """Every cross-field rule by the model that declares it (tests check the CRD has them)."""
    from leasebox_operator import pod_fields

    models: list[type[Model]] = [PoolSpec, ScalingSpec, WorkerSpec, QuotaSpec]
    models += [pod_fields.EnvVarSource, pod_fields.Volume]
    return {"OutboxWorkerPool": POOL_RULES} | {m.__name__: m.cel_rules for m in models}
