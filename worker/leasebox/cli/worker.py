"""`leasebox worker`: claim, send and settle outbox rows until SIGTERM (or drained).

Every flag can also come from a `LEASEBOX_*` variable, which is how the operator configures
its Deployment; a flag wins over its variable. Values are validated here rather than by
argparse so that a bad one, from either source, is one error line naming its source.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from leasebox.cli.common import add_database_options

DEFAULT_KINDS = "otp,verification,password_reset,invite"

# flag dest -> (environment variable, default as a string or None)
ENVIRONMENT: dict[str, tuple[str, str | None]] = {
    "kinds": ("LEASEBOX_KINDS", DEFAULT_KINDS),
    "provider": ("LEASEBOX_PROVIDER_URL", None),
    "provider_timeout": ("LEASEBOX_PROVIDER_TIMEOUT", "10"),
    "templates": ("LEASEBOX_TEMPLATES", None),
    "concurrency": ("LEASEBOX_CONCURRENCY", "32"),
    "batch_size": ("LEASEBOX_BATCH_SIZE", None),
    "lease_seconds": ("LEASEBOX_LEASE_SECONDS", "45"),
    "poll_interval": ("LEASEBOX_POLL_INTERVAL", "1"),
    "grace": ("LEASEBOX_GRACE", "30"),
    "max_attempts": ("LEASEBOX_MAX_ATTEMPTS", "8"),
    "backoff_base": ("LEASEBOX_BACKOFF_BASE", "2"),
    "backoff_max": ("LEASEBOX_BACKOFF_MAX", "300"),
    "metrics_port": ("LEASEBOX_METRICS_PORT", "9108"),
    "metrics_host": ("LEASEBOX_METRICS_HOST", "0.0.0.0"),  # noqa: S104
    "log_format": ("LEASEBOX_LOG_FORMAT", None),
    "log_level": ("LEASEBOX_LOG_LEVEL", "info"),
    "worker_id": ("LEASEBOX_WORKER_ID", None),
}
SWITCHES = {"no_listen": "LEASEBOX_NO_LISTEN", "drain": "LEASEBOX_DRAIN"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="claim outbox rows under a lease and send them through a provider",
        description="Claim ready outbox rows of some kinds under a short lease, send them "
        "through the provider with a stable delivery key, and mark them sent while the "
        "lease is still held. Every option also reads LEASEBOX_<OPTION> (shown per option).",
    )
    add_database_options(parser)
    option = _option_adder(parser)
    option("--kinds", "comma-separated kinds to claim (default: %(default)s)")
    option("--provider", "provider URL: smtp://, smtps://, http(s)://, log://, null:// (required)")
    option("--provider-timeout", "seconds a provider call may take (default: %(default)s)")
    option("--templates", "directory whose templates override the built-ins", metavar="DIR")
    option("--concurrency", "sends in flight at once (default: %(default)s)")
    option("--batch-size", "most rows per claim statement (default: the concurrency)")
    option("--lease-seconds", "lease length; long sends extend it (default: %(default)s)")
    option("--poll-interval", "longest idle wait between claims, seconds (default: %(default)s)")
    option("--grace", "seconds in-flight sends may take after SIGTERM (default: %(default)s)")
    option("--max-attempts", "attempt limit for rows without their own (default: %(default)s)")
    option("--backoff-base", "first retry delay, seconds (default: %(default)s)")
    option("--backoff-max", "longest retry delay, seconds (default: %(default)s)")
    option("--metrics-port", "port of /metrics, /healthz, /readyz; 0 = off (default: %(default)s)")
    option("--metrics-host", "address the metrics server binds (default: %(default)s)")
    option("--log-format", "json or text (default: text at a terminal, else json)")
    option("--log-level", "debug, info, warning or error (default: %(default)s)")
    option("--worker-id", "name recorded in leased_by and logs (default: hostname-pid)")
    parser.add_argument(
        "--no-listen",
        action="store_true",
        default=None,
        help="do not LISTEN for new rows; poll only [LEASEBOX_NO_LISTEN]",
    )
    parser.add_argument(
        "--drain",
        action="store_true",
        default=None,
        help="exit once nothing is ready (batch jobs, benchmarks) [LEASEBOX_DRAIN]",
    )
    parser.set_defaults(func=run_worker, schema=None)


def _option_adder(parser: argparse.ArgumentParser) -> Any:
    def option(flag: str, text: str, metavar: str | None = None) -> None:
        dest = flag.lstrip("-").replace("-", "_")
        variable, default = ENVIRONMENT[dest]
        help_text = text.replace("%(default)s", default or "") + f" [{variable}]"
        parser.add_argument(flag, dest=dest, metavar=metavar, help=help_text)

    return option


def _value(args: argparse.Namespace, dest: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """The raw value of an option and where it came from (for error messages)."""
    variable, default = ENVIRONMENT[dest]
    flag = "--" + dest.replace("_", "-")
    explicit = getattr(args, dest, None)
    if explicit is not None:
        return explicit, flag
    from_env = environ.get(variable, "").strip()
    if from_env:
        return from_env, variable
    return default or "", flag


def _number(args: argparse.Namespace, dest: str, environ: Mapping[str, str], kind: type) -> Any:
    from leasebox.errors import ConfigurationError

    raw, source = _value(args, dest, environ)
    try:
        value = kind(raw)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise ConfigurationError(f"{source} must be {noun}, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigurationError(f"{source} must be a finite number")
    return value


def _switch(args: argparse.Namespace, dest: str, environ: Mapping[str, str]) -> bool:
    from leasebox.errors import ConfigurationError

    if getattr(args, dest, None):
        return True
    raw = environ.get(SWITCHES[dest], "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigurationError(f"{SWITCHES[dest]} must be true or false")


def process_config(args: argparse.Namespace, environ: Mapping[str, str]) -> Any:
    """`ProcessConfig` from flags and environment; `ConfigurationError` on any bad value."""
    from leasebox.db.connections import resolve_dsn
    from leasebox.db.queries import DEFAULT_SCHEMA, validate_schema_name
    from leasebox.errors import ConfigurationError
    from leasebox.runtime.process import ProcessConfig
    from leasebox.runtime.settings import WorkerSettings, default_worker_id

    provider, _ = _value(args, "provider", environ)
    if not provider:
        raise ConfigurationError(
            "no provider given: pass --provider or set LEASEBOX_PROVIDER_URL, e.g. "
            "smtp://user:password@mail.example.com:587 or log://"
        )
    kinds_raw, kinds_source = _value(args, "kinds", environ)
    kinds = tuple(k.strip() for k in kinds_raw.split(",") if k.strip())
    try:
        concurrency = _number(args, "concurrency", environ, int)
        batch_raw, _ = _value(args, "batch_size", environ)
        settings = WorkerSettings(
            kinds=kinds,
            schema=validate_schema_name(
                args.schema or environ.get("LEASEBOX_SCHEMA", "").strip() or DEFAULT_SCHEMA
            ),
            concurrency=concurrency,
            batch_size=_number(args, "batch_size", environ, int) if batch_raw else concurrency,
            lease_seconds=_number(args, "lease_seconds", environ, float),
            poll_interval=_number(args, "poll_interval", environ, float),
            listen=not _switch(args, "no_listen", environ),
            grace_seconds=_number(args, "grace", environ, float),
            drain=_switch(args, "drain", environ),
            max_attempts=_number(args, "max_attempts", environ, int),
            backoff_base=_number(args, "backoff_base", environ, float),
            backoff_max=_number(args, "backoff_max", environ, float),
            worker_id=_value(args, "worker_id", environ)[0] or default_worker_id(),
        )
    except ConfigurationError as exc:
        if "kind" in str(exc):
            raise ConfigurationError(f"{kinds_source}: {exc}") from None
        raise
    port = _number(args, "metrics_port", environ, int)
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"the metrics port must be 0 to 65535, got {port}")
    timeout = _number(args, "provider_timeout", environ, float)
    if timeout <= 0:
        raise ConfigurationError("the provider timeout must be positive")
    templates, _ = _value(args, "templates", environ)
    return ProcessConfig(
        settings=settings,
        dsn=resolve_dsn(args.dsn, environ),
        provider_url=provider,
        templates_dir=Path(templates) if templates else None,
        provider_timeout=timeout,
        metrics_host=_value(args, "metrics_host", environ)[0],
        metrics_port=port,
    )


def run_worker(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from leasebox.errors import ConfigurationError
    from leasebox.runtime.logs import configure_logging, default_format, remove_logging
    from leasebox.runtime.process import secret_values, serve

    config = process_config(args, os.environ)
    log_format = _value(args, "log_format", os.environ)[0] or default_format(sys.stderr)
    log_level = _value(args, "log_level", os.environ)[0]
    try:
        handler = configure_logging(log_format, log_level, mask=secret_values(config, os.environ))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        return asyncio.run(serve(config))
    finally:
        remove_logging(handler)
