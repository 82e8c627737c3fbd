"""Options every database command shares, defined once."""

from __future__ import annotations

import argparse

from leasebox.queries import DEFAULT_SCHEMA, validate_schema_name


def add_database_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        help="PostgreSQL DSN (default: $LEASEBOX_DSN, else $DATABASE_URL)",
    )
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
    import re

    from leasebox.messages import KIND_PATTERN

    kinds = [k.strip() for k in value.split(",") if k.strip()]
    bad = [k for k in kinds if not re.fullmatch(KIND_PATTERN, k)]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(
            f"invalid kind list {value!r}: kinds are lower-case identifiers separated by commas"
        )
    return kinds
