"""What several commands share, defined once: the database settings (read one way by every
command), kind lists, durations, positive counts, garbage-collection thresholds."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from leasebox import config
from leasebox.db.queries import DEFAULT_SCHEMA
from leasebox.errors import ConfigurationError


@contextlib.contextmanager
def gc_thresholds(thresholds: tuple[int, int, int]) -> Iterator[None]:
    """Python's garbage-collection thresholds for the body of the block; the previous ones
    after it (a command run in-process leaves the interpreter as it found it)."""
    previous = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


@dataclass(frozen=True)
class Database:
    """Where a command works: the DSN and the schema of the leasebox tables."""

    dsn: str
    schema: str


def database(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Database:
    """The database settings every command reads, the same way: the DSN from `--dsn`, else
    `LEASEBOX_DSN`, else `DATABASE_URL`; the schema from `--schema`, else `LEASEBOX_SCHEMA`,
    else `leasebox` (a bad value is one line naming where it came from)."""
    from leasebox.db.connections import resolve_dsn

    env = os.environ if environ is None else environ
    schema, _ = config.read(config.SCHEMA, vars(args), env)
    return Database(resolve_dsn(getattr(args, "dsn", None), env), schema)


def parse_duration(text: str) -> float:
    """Seconds in `90`, `90s`, `15m`, `1h`, `7d` or `2w`."""
    try:
        return config.duration(text)
    except ValueError:
        raise ConfigurationError(
            f"invalid duration {text!r}: use a number with s, m, h, d or w, e.g. 1h or 7d"
        ) from None


def add_database_options(parser: argparse.ArgumentParser, *, schema: bool = True) -> None:
    """`--dsn`, and `--schema` unless the command reads it with its other settings; both are
    read by `database`."""
    parser.add_argument(
        "--dsn",
        help="PostgreSQL DSN (default: $LEASEBOX_DSN, else $DATABASE_URL)",
    )
    if not schema:
        return
    parser.add_argument(
        config.SCHEMA.flag,
        dest=config.SCHEMA.dest,
        help=f"schema holding the leasebox tables (default: ${config.SCHEMA.variable}, "
        f"else {DEFAULT_SCHEMA})",
    )


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


def connect_migrated(args: argparse.Namespace) -> tuple[Any, str]:
    """A connection to the command's database (`database`), whose schema is migrated (else
    `NotMigrated`), and that schema."""
    from leasebox.db.connections import check_migrated, connect

    db = database(args)
    conn = connect(db.dsn)
    try:
        check_migrated(conn, db.schema)
    except BaseException:
        conn.close()
        raise
    return conn, db.schema
