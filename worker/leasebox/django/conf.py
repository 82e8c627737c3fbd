"""leasebox's settings in a Django project: `settings.LEASEBOX`, else `LEASEBOX_*` variables.

A Django project keeps its configuration in `settings.py`, so that is read first:

    LEASEBOX = {
        "SCHEMA": "leasebox",            # LEASEBOX_SCHEMA
        "DATABASE": "default",           # LEASEBOX_DATABASE: the connection alias
        "PAYLOAD_KEYS": [...],           # LEASEBOX_PAYLOAD_KEYS: Fernet keys, first encrypts
        "GUARD": {"per_recipient": 5, "per_scope": 100, "window_seconds": 3600},
        "RECEIPT_TTL_SECONDS": 86400,
    }

A key missing there falls back to its environment variable (the one the worker reads too),
then to leasebox's default. A key that does not exist, or a value that is malformed, is an
`ImproperlyConfigured` that names it: `manage.py check` reports it before the first request.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from leasebox.db.queries import DEFAULT_SCHEMA, validate_schema_name
from leasebox.errors import LeaseboxError
from leasebox.producer.enqueue import DEFAULT_RECEIPT_TTL_SECONDS
from leasebox.producer.guard import AbuseGuard
from leasebox.producer.payload_crypto import KEYS_VARIABLE, PayloadCipher, default_cipher

SETTING = "LEASEBOX"
KEYS = ("SCHEMA", "DATABASE", "PAYLOAD_KEYS", "GUARD", "RECEIPT_TTL_SECONDS")
_GUARD_FIELDS = ("per_recipient", "per_scope", "window_seconds")


@dataclass(frozen=True)
class LeaseboxSettings:
    """What `leasebox.django.enqueue` and the migration use when a call does not say."""

    schema: str = DEFAULT_SCHEMA
    database: str = "default"
    payload_keys: tuple[str, ...] = field(default=(), repr=False)
    guard: AbuseGuard | None = None
    receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL_SECONDS

    def cipher(self) -> PayloadCipher:
        return PayloadCipher(list(self.payload_keys)) if self.payload_keys else default_cipher()


def _problem(key: str, detail: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{SETTING}[{key!r}] {detail}")


def _guard(value: object) -> AbuseGuard | None:
    if value is None or isinstance(value, AbuseGuard):
        return value
    if not isinstance(value, Mapping):
        raise _problem("GUARD", "must be a dict such as {'per_recipient': 5} or an AbuseGuard")
    unknown = sorted(set(value) - set(_GUARD_FIELDS))
    if unknown:
        raise _problem(
            "GUARD", f"has unknown key {unknown[0]!r}; known: {', '.join(_GUARD_FIELDS)}"
        )
    try:
        return AbuseGuard(**dict(value))
    except (LeaseboxError, TypeError) as exc:
        raise _problem("GUARD", f"is invalid: {exc}") from None


def _keys(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple) or not all(isinstance(k, str) for k in value):
        raise _problem(
            "PAYLOAD_KEYS", "must be a list of Fernet keys (or one comma-separated string)"
        )
    keys = tuple(k.strip() for k in value if k.strip())
    try:
        PayloadCipher(list(keys))
    except LeaseboxError:
        raise _problem("PAYLOAD_KEYS", "holds a value that is not a Fernet key") from None
    return keys


def read_settings(
    configured: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> LeaseboxSettings:
    """The settings from `configured` (default: `settings.LEASEBOX`), then the environment."""
    if configured is None:
        configured = getattr(django_settings, SETTING, {})
    if not isinstance(configured, Mapping):
        raise ImproperlyConfigured(f"{SETTING} must be a dict")
    env = os.environ if environ is None else environ
    unknown = sorted(set(configured) - set(KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"{SETTING} has unknown key {unknown[0]!r}; known keys: {', '.join(KEYS)}"
        )

    def pick(key: str, variable: str | None) -> Any:
        if key in configured:
            return configured[key]
        if variable and env.get(variable, "").strip():
            return env[variable].strip()
        return None

    schema = pick("SCHEMA", "LEASEBOX_SCHEMA") or DEFAULT_SCHEMA
    try:
        validate_schema_name(str(schema))
    except LeaseboxError as exc:
        raise _problem("SCHEMA", str(exc)) from None
    database = pick("DATABASE", "LEASEBOX_DATABASE") or "default"
    if not isinstance(database, str):
        raise _problem("DATABASE", "must be the alias of a connection in DATABASES")
    ttl = pick("RECEIPT_TTL_SECONDS", None)
    if ttl is None:
        ttl = DEFAULT_RECEIPT_TTL_SECONDS
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl < 0:
        raise _problem("RECEIPT_TTL_SECONDS", "must be a number of seconds, 0 or more")
    keys = pick("PAYLOAD_KEYS", KEYS_VARIABLE)
    return LeaseboxSettings(
        schema=str(schema),
        database=database,
        payload_keys=_keys(keys) if keys is not None else (),
        guard=_guard(configured.get("GUARD")),
        receipt_ttl_seconds=float(ttl),
    )
