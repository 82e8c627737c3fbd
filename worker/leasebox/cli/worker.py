"""`leasebox worker`: claim, send and settle outbox rows until SIGTERM (or drained).

Every flag also comes from a `LEASEBOX_*` variable, which is how the operator configures
its Deployment; a flag wins over its variable. Flags, variables, defaults and help come from
one table (`leasebox.config`), so this module only turns what it reads into the
process's configuration.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from leasebox import config as options
from leasebox.cli.common import add_database_options, database, gc_thresholds
from leasebox.config import OPTIONS, Style, Target

# The worker's young collections come every 10,000 allocations instead of 700. A drain
# allocates in bursts (a claim's rows, their emails, their completions) that refcounting
# frees a moment later, but each burst crossed the default threshold, and collecting took
# about 8 % of a draining worker's CPU (0.12 to 0.14 s of a 100,000-row drain, 300
# collections). At 10,000 a 100,000-row drain collects once.
GC_THRESHOLDS = (10_000, 20, 20)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="claim outbox rows under a lease and send them through a provider",
        description="Claim ready outbox rows of some kinds under a short lease, send them "
        "through the provider with a stable delivery key, and mark them sent while the "
        "lease is still held. Every option also reads LEASEBOX_<OPTION> (shown per option).",
    )
    add_database_options(parser, schema=False)
    for option in OPTIONS:
        unset = option.default is None or option.default == ""
        shown = "" if unset else f" (default: {option.render(option.default)})"
        help_text = f"{option.help}{shown} [{option.variable}]"
        if option.style is Style.VALUE:
            parser.add_argument(
                option.flag, dest=option.dest, metavar=option.metavar, help=help_text
            )
        else:
            help_text = f"{option.help} [{option.variable}]"
            parser.add_argument(
                option.flag, dest=option.dest, action="store_true", default=None, help=help_text
            )
    parser.set_defaults(func=run_worker)


def read_options(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """Every option's value by attribute name, from flags, then variables, then defaults."""
    flags = vars(args)
    return {option.name: options.read(option, flags, environ)[0] for option in OPTIONS}


def process_config(args: argparse.Namespace, environ: Mapping[str, str]) -> Any:
    """`ProcessConfig` from flags and environment; `ConfigurationError` on any bad value."""
    from leasebox.errors import ConfigurationError
    from leasebox.runtime.process import ProcessConfig
    from leasebox.runtime.settings import WorkerSettings, default_worker_id

    values = read_options(args, environ)
    if not values["provider_url"]:
        raise ConfigurationError(
            "no provider given: pass --provider or set LEASEBOX_PROVIDER_URL, e.g. "
            "smtp://user:password@mail.example.com:587 or log://"
        )
    chosen = {o.name: values[o.name] for o in OPTIONS if o.target is Target.SETTINGS}
    chosen["batch_size"] = chosen["batch_size"] or chosen["concurrency"]
    chosen["worker_id"] = chosen["worker_id"] or default_worker_id()
    if chosen["quota_rate"] is not None and not chosen["quota_account"]:
        chosen["quota_account"] = account_of(values["provider_url"])
    try:
        settings = WorkerSettings(**chosen)
    except ConfigurationError as exc:
        # The settings check values, not sources: name where a value they refuse came from.
        named: tuple[tuple[str, options.Option[Any]], ...] = (
            ("priorit", options.PRIORITIES),
            ("aging", options.PRIORITIES),
            ("kind", options.KINDS),
            ("retention", options.RETENTION),
            ("quota burst", options.QUOTA_BURST),
            ("quota account", options.QUOTA_ACCOUNT),
            ("quota", options.QUOTA),
        )
        for word, option in named:
            if word in str(exc):
                _, source = options.read(option, vars(args), environ)
                raise ConfigurationError(f"{source}: {exc}") from None
        raise
    port = values["metrics_port"]
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"the metrics port must be 0 to 65535, got {port}")
    if values["provider_timeout"] <= 0:
        raise ConfigurationError("the provider timeout must be positive")
    process = {o.name: values[o.name] for o in OPTIONS if o.target is Target.PROCESS}
    for logging_option in (options.LOG_FORMAT, options.LOG_LEVEL):
        del process[logging_option.name]
    return ProcessConfig(settings=settings, dsn=database(args, environ).dsn, **process)


def account_of(provider_url: str) -> str:
    """The provider account a URL names, without its credentials or options: workers with
    the same provider URL share a quota unless they name their account."""
    from urllib.parse import urlsplit

    parts = urlsplit(provider_url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # refused with its reason when the provider is built
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def run_worker(args: argparse.Namespace) -> int:
    import sys

    from leasebox.errors import ConfigurationError
    from leasebox.runtime.event_loops import run
    from leasebox.runtime.logs import configure_logging, default_format, remove_logging
    from leasebox.runtime.process import secret_values, serve

    config = process_config(args, os.environ)
    values = read_options(args, os.environ)
    log_format = values["log_format"] or default_format(sys.stderr)
    try:
        handler = configure_logging(
            log_format, values["log_level"], mask=secret_values(config, os.environ)
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        with gc_thresholds(GC_THRESHOLDS):
            return run(lambda: serve(config), config.event_loop)
    finally:
        remove_logging(handler)
