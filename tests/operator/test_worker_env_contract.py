"""What the operator writes into a worker pod's env is what `leasebox worker` reads.

The round trip: a pool's spec becomes the Deployment's env (`children.worker_env`), the env
becomes the worker's configuration (`leasebox worker`'s own reading), and the worker ends up
with exactly the spec's values. A renamed variable on either side breaks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from leasebox.cli.main import build_parser
from leasebox.cli.worker import process_config, read_options
from leasebox.config import OPTIONS
from leasebox.db.connections import DSN_VARIABLES
from leasebox.producer.payload_crypto import KEYS_VARIABLE
from leasebox_operator.children import Pool, worker_env
from leasebox_operator.models import RESERVED_ENV
from leasebox_operator.reconcile import parse_pool

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    ("leasebox-database", "dsn"): "postgresql://app@db:5432/app",
    ("mail-provider", "url"): "smtp://mail.internal:25",
    ("leasebox-payload-keys", "keys"): "k" * 43 + "=",
}


def _full_pool() -> Pool:
    return parse_pool(yaml.safe_load((ROOT / "examples" / "pool-full.yaml").read_text()))


def _resolved(env: list[dict[str, Any]]) -> dict[str, str]:
    """The env as a pod would see it, with each Secret reference replaced by its value."""
    values = {}
    for entry in env:
        if "value" in entry:
            values[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            values[entry["name"]] = SECRETS[(ref["name"], ref["key"])]
    return values


def test_a_pool_spec_reaches_the_worker_settings_through_the_env() -> None:
    pool = _full_pool()
    environ = _resolved(worker_env(pool))
    args = build_parser().parse_args(["worker"])
    config = process_config(args, environ)
    spec, worker, settings = pool.spec, pool.spec.worker, config.settings
    assert settings.kinds == tuple(spec.kinds)
    assert settings.schema == spec.database.schema_name
    assert settings.concurrency == worker.concurrency
    assert settings.lease_seconds == worker.lease_seconds
    assert settings.grace_seconds == worker.lease_seconds
    assert settings.max_attempts == worker.max_attempts
    assert (settings.backoff_base, settings.backoff_max) == (
        worker.backoff_base_seconds,
        worker.backoff_max_seconds,
    )
    assert spec.database.retention_days is not None
    assert settings.retention_seconds == spec.database.retention_days * 86400
    assert config.dsn == SECRETS[("leasebox-database", "dsn")]
    assert config.provider_url == SECRETS[("mail-provider", "url")]
    assert str(config.templates_dir) == "/etc/leasebox/templates"
    assert config.metrics_port == 9108
    values = read_options(args, environ)
    assert values["log_format"] == worker.log_format
    assert values["log_level"] == "info"  # the pool's own env entry, read by the worker too


def test_every_variable_the_operator_writes_is_one_the_worker_reads() -> None:
    read = {option.variable for option in OPTIONS} | {*DSN_VARIABLES, KEYS_VARIABLE}
    written = {entry["name"] for entry in worker_env(_full_pool())}
    assert written <= read | {"SSL_CERT_FILE"}  # the example's own env entry


def test_the_reserved_names_are_exactly_the_ones_the_operator_writes() -> None:
    pool = _full_pool()
    own = {entry["name"] for entry in worker_env(pool)} - {
        e.name for e in pool.spec.worker.env or ()
    }
    assert own == set(RESERVED_ENV)
