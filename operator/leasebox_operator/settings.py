"""The operator's own settings, as one documented, frozen dataclass.

`leasebox operator` builds them from its flags; `kopf run -m leasebox_operator.handlers`
(no CLI in front) builds them from `LEASEBOX_OPERATOR_*` variables. Either way the
startup handler applies them to kopf once, so the finalizer and annotation names under
`leasebox.dev` never depend on how the process was started.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from leasebox.errors import ConfigurationError
from leasebox.version import __version__

DOMAIN = "leasebox.dev"
ENV_PREFIX = "LEASEBOX_OPERATOR_"


@dataclass(frozen=True)
class OperatorSettings:
    """How one operator process runs.

    Attributes:
        namespaces: namespaces (or kopf glob patterns) to watch; empty with `clusterwide`.
        clusterwide: watch every namespace.
        standalone: run without peering (no other operator instance coordinates with it).
        priority: peering priority; the highest-priority instance handles the pools.
        peering_name: name of the KopfPeering object instances coordinate through.
        liveness_endpoint: kopf's liveness URL, e.g. http://0.0.0.0:8080/healthz; None: off.
        metrics_port: port of the operator's Prometheus endpoint; 0: off.
        metrics_host: address it binds.
        log_format: "json", "plain" or "full".
        verbose: log debug messages.
        worker_image: image of worker pods whose pool does not name one.
        statement_timeout_seconds: server-side timeout of the backlog query.
        connect_timeout_seconds: timeout of one database connection attempt.
        pool_max_connections: connections per database, shared by every pool using it.
        backlog_gather_seconds: how long a pool's backlog read waits for other pools' reads
            of the same database to go out with them as one query (0: every read alone).
        max_poll_backoff_seconds: longest wait between polls while the database is down.
        api_backoffs: delays between retries of a failed Kubernetes API request.
        finalizer: the finalizer kopf puts on pools (so daemons stop before deletion).
        annotation_prefix: prefix of kopf's progress and last-handled annotations.
        resync_seconds: how often each pool's children are applied again (drift repair; a
            change of the worker Deployment's spec is put back at the next poll).
        status_heartbeat_seconds: longest a pool's status goes without a write while only
            its ages, rates and condition messages change (see `status.StatusWriter`).
        peering_lifetime_seconds: how long a silent peer counts as alive (failover time).
        runbook_base_url: base of the runbook links in pools' PrometheusRules.
        identity: this instance in Events, user-agents and peering (pod name, else host).
    """

    namespaces: tuple[str, ...] = ()
    clusterwide: bool = False
    standalone: bool = False
    priority: int = 0
    peering_name: str = "leasebox"
    liveness_endpoint: str | None = "http://0.0.0.0:8080/healthz"
    metrics_port: int = 9109
    metrics_host: str = "0.0.0.0"  # noqa: S104 (a pod's port, reached through its Service)
    log_format: str = "json"
    verbose: bool = False
    worker_image: str = f"ghcr.io/leasebox/leasebox:{__version__}"
    statement_timeout_seconds: float = 5.0
    connect_timeout_seconds: float = 5.0
    pool_max_connections: int = 4
    backlog_gather_seconds: float = 0.1
    max_poll_backoff_seconds: float = 60.0
    api_backoffs: tuple[float, ...] = field(default=(1, 1, 2, 3, 5, 8))
    finalizer: str = f"{DOMAIN}/finalizer"
    annotation_prefix: str = DOMAIN
    resync_seconds: float = 300.0
    status_heartbeat_seconds: float = 30.0
    peering_lifetime_seconds: int = 60
    runbook_base_url: str = "https://github.com/leasebox/leasebox/blob/main/docs/runbooks.md"
    identity: str = field(
        default_factory=lambda: os.environ.get("POD_ID") or f"{socket.gethostname()}-{os.getpid()}"
    )

    def __post_init__(self) -> None:
        if self.clusterwide and self.namespaces:
            raise ConfigurationError("give namespaces or cluster-wide, not both")
        if self.log_format not in ("json", "plain", "full"):
            raise ConfigurationError(
                f"log format must be json, plain or full, got {self.log_format!r}"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(f"metrics port {self.metrics_port} is out of range")
        for name in (
            "statement_timeout_seconds",
            "connect_timeout_seconds",
            "max_poll_backoff_seconds",
            "resync_seconds",
            "status_heartbeat_seconds",
            "peering_lifetime_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0")
        if not 0 <= self.backlog_gather_seconds <= 1:
            raise ConfigurationError("backlog_gather_seconds must be between 0 and 1")
        if self.pool_max_connections < 1:
            raise ConfigurationError("pool_max_connections must be >= 1")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """Settings from `LEASEBOX_OPERATOR_*` variables; unset ones keep their defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        casts = {
            "METRICS_PORT": ("metrics_port", int),
            "METRICS_HOST": ("metrics_host", str),
            "LOG_FORMAT": ("log_format", str),
            "WORKER_IMAGE": ("worker_image", str),
            "STATEMENT_TIMEOUT": ("statement_timeout_seconds", float),
            "CONNECT_TIMEOUT": ("connect_timeout_seconds", float),
            "POOL_MAX_CONNECTIONS": ("pool_max_connections", int),
            "BACKLOG_GATHER": ("backlog_gather_seconds", float),
            "MAX_POLL_BACKOFF": ("max_poll_backoff_seconds", float),
            "RESYNC": ("resync_seconds", float),
            "STATUS_HEARTBEAT": ("status_heartbeat_seconds", float),
            "PEERING_LIFETIME": ("peering_lifetime_seconds", int),
            "RUNBOOK_BASE_URL": ("runbook_base_url", str),
        }
        for suffix, (name, cast) in casts.items():
            raw = env.get(ENV_PREFIX + suffix, "").strip()
            if not raw:
                continue
            try:
                values[name] = cast(raw)
            except ValueError:
                raise ConfigurationError(f"{ENV_PREFIX}{suffix}={raw!r} is not valid") from None
        backoffs = env.get(ENV_PREFIX + "API_BACKOFFS", "").strip()
        if backoffs:
            try:
                values["api_backoffs"] = tuple(float(b) for b in backoffs.split(","))
            except ValueError:
                raise ConfigurationError(
                    f"{ENV_PREFIX}API_BACKOFFS={backoffs!r} is not a list of seconds"
                ) from None
        return cls(**values)  # type: ignore[arg-type]
