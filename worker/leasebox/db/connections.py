"""Connecting to PostgreSQL with errors a person can act on.

Every command resolves its DSN the same way (flag, `LEASEBOX_DSN`, `DATABASE_URL`), in any
spelling an application's own `DATABASE_URL` may have (SQLAlchemy's `postgresql+psycopg://`
and `postgresql+asyncpg://` too, `libpq_dsn`), and
every failure to connect becomes one line that names the host and never the password: the
server's own reason (libpq wraps it in "connection to server at ... failed:" once per address
it tried), and for a refused password what to check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import psycopg
from psycopg import conninfo

from leasebox.db.queries import validate_schema_name
from leasebox.errors import ConfigurationError, DatabaseUnavailable, NotMigrated

DSN_VARIABLES = ("LEASEBOX_DSN", "DATABASE_URL")
APPLICATION_NAME = "leasebox"
# What "the database is unavailable right now" looks like to a caller that retries: psycopg's
# operational and interface errors (a pool timeout is an operational error) and our own
# statement timeouts. Anything else from the database is a bug or bad data, not an outage.
DATABASE_ERRORS = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    TimeoutError,
)
# The longest any one statement of the worker may take before it counts as an outage.
STATEMENT_TIMEOUT = 30.0
# Seconds to wait for a new connection, and for a free one from a pool.
CONNECT_TIMEOUT = 5
POOL_TIMEOUT = 5.0


# SQLAlchemy names its driver in the URL's scheme (`postgresql+psycopg://`), which libpq does
# not know; asyncpg's URLs say `ssl=` where libpq says `sslmode=`.
_DRIVER_SCHEME = re.compile(r"^(postgres(?:ql)?)\+([A-Za-z0-9_]+)://", re.IGNORECASE)
_ASYNCPG_SSL = {"true": "require", "false": "disable"}
_SSL_MODES = frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"})


def libpq_dsn(dsn: str) -> str:
    """`dsn` as libpq reads it, so that one `DATABASE_URL` serves an application's SQLAlchemy
    engine and leasebox: `postgresql+psycopg://` and `postgresql+asyncpg://` (any `+driver`)
    become `postgresql://`, and asyncpg's `ssl=require` becomes `sslmode=require`. Any other
    DSN (a libpq URL, `key=value` pairs) is returned as it is."""
    text = dsn.strip()
    found = _DRIVER_SCHEME.match(text)
    if found is None:
        return dsn
    rest = text[found.end() :]
    if found.group(2).lower() == "asyncpg":
        rest = _libpq_ssl(rest)
    return f"postgresql://{rest}"


def _libpq_ssl(rest: str) -> str:
    """The part after `scheme://` with asyncpg's `ssl` option spelled as libpq's `sslmode`."""
    where, mark, query_text = rest.partition("?")
    if not mark:
        return rest
    options = []
    for option in query_text.split("&"):
        name, equals, value = option.partition("=")
        if name == "ssl" and equals:
            mode = _ASYNCPG_SSL.get(value.lower(), value.lower())
            if mode not in _SSL_MODES:
                raise ConfigurationError(
                    "the DSN's ssl option must be one of "
                    f"{', '.join(sorted(_SSL_MODES))}, true or false"
                )
            option = f"sslmode={mode}"
        options.append(option)
    return f"{where}?{'&'.join(options)}"


def resolve_dsn(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The DSN from the flag, else `LEASEBOX_DSN`, else `DATABASE_URL`, as libpq reads it."""
    if explicit:
        return libpq_dsn(explicit)
    env = os.environ if environ is None else environ
    for name in DSN_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return libpq_dsn(value)
    raise ConfigurationError(
        "no database given: pass --dsn or set LEASEBOX_DSN (or DATABASE_URL), e.g. "
        "postgresql://leasebox@db:5432/app"
    )


def redact_dsn(dsn: str) -> str:
    """The DSN with its password replaced, safe for logs and error messages."""
    try:
        params = conninfo.conninfo_to_dict(libpq_dsn(dsn))
    except (psycopg.ProgrammingError, ConfigurationError):
        return "<unparseable DSN>"
    if "password" in params:
        params["password"] = "***"  # noqa: S105 - the placeholder that replaces it
    return conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def describe_target(dsn: str) -> str:
    """`host:port/dbname` of a DSN, for one-line errors."""
    try:
        params = conninfo.conninfo_to_dict(libpq_dsn(dsn))
    except (psycopg.ProgrammingError, ConfigurationError):
        return "<unparseable DSN>"
    host = str(params.get("host") or "local socket")
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or params.get("user") or "")
    return f"{host}:{port}/{dbname}"


_ATTEMPT = re.compile(r"connection to server (?:at|on) .*? failed: (.*)$")
_AUTH_HINTS = {
    "password authentication failed": "check the user name and password in the DSN",
    "no password supplied": "the server requires a password and the DSN gives none",
}


def connection_error(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """A one-line, password-free error for a failed connection attempt."""
    detail = _reason(str(exc)) or type(exc).__name__
    for symptom, hint in _AUTH_HINTS.items():
        if symptom in detail:
            detail = f"{detail}; {hint}"
            break
    password = conninfo.conninfo_to_dict(libpq_dsn(dsn)).get("password") if _parses(dsn) else None
    if password:
        detail = detail.replace(str(password), "***")
    return DatabaseUnavailable(f"cannot connect to PostgreSQL at {describe_target(dsn)}: {detail}")


def _reason(message: str) -> str:
    """The server's reason for refusing, from libpq's report of every address it tried:
    an authentication failure if there is one, else the last attempt's reason."""
    reasons = [
        found.group(1).removeprefix("FATAL:").strip()
        for line in message.splitlines()
        if (found := _ATTEMPT.search(line.strip()))
    ]
    for reason in reasons:
        if any(symptom in reason for symptom in _AUTH_HINTS):
            return reason
    if reasons:
        return reasons[-1]
    lines = message.strip().splitlines()
    return lines[0].strip() if lines else ""


def _parses(dsn: str) -> bool:
    try:
        conninfo.conninfo_to_dict(libpq_dsn(dsn))
    except (psycopg.ProgrammingError, ConfigurationError):
        return False
    return True


def connect(dsn: str, *, autocommit: bool = False, connect_timeout: int = 10) -> psycopg.Connection:
    """A synchronous connection, or `DatabaseUnavailable` with a readable reason."""
    dsn = libpq_dsn(dsn)
    if not _parses(dsn):
        raise ConfigurationError("the DSN cannot be parsed; expected postgresql://user@host/db")
    try:
        return psycopg.connect(
            dsn,
            autocommit=autocommit,
            connect_timeout=connect_timeout,
            application_name=APPLICATION_NAME,
        )
    except psycopg.OperationalError as exc:
        raise connection_error(dsn, exc) from None


def check_migrated(conn: psycopg.Connection, schema: str) -> None:
    """Raise `NotMigrated` unless the schema's tables exist."""
    validate_schema_name(schema)
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
        (f'"{schema}".outbox', f'"{schema}".receipts'),
    ).fetchone()
    if not row or not row[0]:
        raise NotMigrated(schema)
