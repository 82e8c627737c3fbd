"""What several commands share, defined once: database options, kind lists, durations,
positive counts."""

from __future__ import annotations

import argparse
import re
from typing import Any

from leasebox.db.queries import DEFAULT_SCHEMA, validate_schema_name
from leasebox.errors import ConfigurationError
from leasebox.runtime import options


def parse_duration(text: str) -> float:
    """Seconds in `90`, `90s`, `15m`, `1h`, `7d` or `2w`."""
    try:
        return options.duration(text)
    except ValueError:
        raise ConfigurationError(
            f"invalid duration {text!r}: use a number with s, m, h, d or w, e.g. 1h or 7d"
        ) from None


def add_database_options(parser: argparse.ArgumentParser, *, schema: bool = True) -> None:
    """`--dsn`, and `--schema` unless the command reads it with its other settings."""
    parser.add_argument(
        "--dsn",
        help="PostgreSQL DSN (default: $LEASEBOX_DSN, else $DATABASE_URL)",
    )
    if not schema:
        return
    parser.add_argument(
        "--schema",
        default=DEFAULT_SCHEMA,
        type=_schema,
        help=f"schema holding the leasebox tables (default: {DEFAULT_SCHEMA})",
    )


def _schema(value: str) -> str:
    try:
        return validate_schema_name(value)
    except Exception as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def kinds_list(value: str) -> list[str]:
    """Parse `otp,verification` into a validated list."""
    from leasebox.messages import KIND_PATTERN

    kinds = [k.strip() for k in value.split(",") if k.strip()]
    bad = [k for k in kinds if not re.fullmatch(KIND_PATTERN, k)]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(
            f"invalid kind list {value!r}: kinds are lower-case identifiers separated by commas"
        )
    return kinds


def positive_int(value: str) -> int:
    """An argparse type: a whole number of at least 1 (limits, batch sizes, ids)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value!r}")
    return number


def connect_migrated(args: argparse.Namespace) -> Any:
    """A connection to `--dsn` whose `--schema` is migrated (else `NotMigrated`)."""
    from leasebox.db.connections import check_migrated, connect, resolve_dsn

    conn = connect(resolve_dsn(args.dsn))
    try:
        check_migrated(conn, args.schema)
    except BaseException:
        conn.close()
        raise
    return conn
