"""`leasebox trace`: what happened to a send, told from its attempt history.

When a user reports two login codes, a person needs two answers quickly: did the API create
one logical send or two, and did one worker own the attempt or did several race it? The
command finds the sends by outbox id, delivery key, idempotency key (in its scope) or
aggregate id, and prints their story in plain words, or as JSON with `--json`. It never
prints a message's data, secrets, code or body; recipients are masked unless
`--show-recipients` is given; errors are the stored, already sanitised ones.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leasebox.cli.common import add_database_options, database, kinds_list, positive_int

if TYPE_CHECKING:
    from leasebox.store.history import Selector

DEFAULT_LIMIT = 20


def register(subparsers: Any) -> None:
    trace = subparsers.add_parser(
        "trace",
        help="tell what happened to a send: requests, attempts, workers, copies",
        description="Find sends by exactly one selector and tell their story from the attempt "
        "history: how many logical sends and requests, each attempt (who claimed it, how and "
        "when it ended), whether one worker owned it or several raced it, and how many copies "
        "the provider accepted. Never shows data, secrets, codes or bodies.",
        epilog="exit status: 0 found, 1 nothing found or the database unreachable, 2 usage "
        "error. A lookup by --aggregate-id scans the outbox (there is no index on it).",
    )
    add_database_options(trace)
    chosen = trace.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--id", type=positive_int, metavar="ID", help="an outbox id")
    chosen.add_argument(
        "--delivery-key", type=_text("delivery key"), metavar="KEY", help="a delivery key"
    )
    chosen.add_argument(
        "--idempotency-key",
        type=_text("idempotency key"),
        metavar="KEY",
        help="the idempotency key a request carried (with --scope)",
    )
    chosen.add_argument(
        "--aggregate-id",
        type=_text("aggregate id"),
        metavar="ID",
        help="the business entity (user id): its sends, newest first (scans the outbox)",
    )
    trace.add_argument(
        "--scope",
        type=_text("scope"),
        help="the idempotency key's scope (default: default; only with --idempotency-key)",
    )
    trace.add_argument(
        "--kind",
        type=_one_kind,
        metavar="KIND",
        help="only sends of this kind (only with --aggregate-id)",
    )
    trace.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help=f"at most this many sends (only with --aggregate-id; default: {DEFAULT_LIMIT})",
    )
    trace.add_argument("--json", action="store_true", help="print JSON instead of words")
    trace.add_argument(
        "--show-recipients",
        action="store_true",
        help="show recipients in full (default: masked, j***@example.com)",
    )
    trace.set_defaults(func=run_trace)


def _text(what: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        from leasebox.errors import InvalidRequest
        from leasebox.messages import check_request_key

        if not value.strip():
            raise argparse.ArgumentTypeError(f"the {what} must not be empty")
        try:
            check_request_key(what.replace(" ", "_"), value)
        except InvalidRequest as exc:  # what the database could not look up
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return parse


def _one_kind(value: str) -> str:
    kinds = kinds_list(value)
    if len(kinds) != 1:
        raise argparse.ArgumentTypeError(f"expected one kind, got {value!r}")
    return kinds[0]


def selector_of(args: argparse.Namespace) -> Selector:
    """The store's selector for the flags, or a usage error for a flag that does not fit."""
    from leasebox.errors import ConfigurationError
    from leasebox.store.history import DEFAULT_SCOPE, Selector

    if args.scope is not None and args.idempotency_key is None:
        raise ConfigurationError("--scope goes with --idempotency-key")
    if (args.kind is not None or args.limit is not None) and args.aggregate_id is None:
        raise ConfigurationError("--kind and --limit go with --aggregate-id")
    return Selector(
        outbox_id=args.id,
        delivery_key=args.delivery_key,
        idempotency_key=args.idempotency_key,
        scope=args.scope or DEFAULT_SCOPE,
        aggregate_id=args.aggregate_id,
        kind=args.kind,
        limit=args.limit or DEFAULT_LIMIT,
    )


def run_trace(args: argparse.Namespace) -> int:
    from leasebox.db.connections import check_migrated, connect
    from leasebox.errors import LeaseboxError
    from leasebox.inspection.narrative import render_text, trace_dict
    from leasebox.inspection.trace import build_trace
    from leasebox.store.history import check_history, read_trace

    selector = selector_of(args)
    db = database(args)
    with connect(db.dsn, autocommit=True) as conn:
        check_migrated(conn, db.schema)
        check_history(conn, schema=db.schema)
        records = read_trace(conn, selector, schema=db.schema)
    if not records.rows:
        raise LeaseboxError(f"nothing to trace: no send has {selector.describe()}")
    trace = build_trace(records, selector, show_recipients=args.show_recipients)
    print(json.dumps(trace_dict(trace), indent=2) if args.json else render_text(trace))
    return 0
