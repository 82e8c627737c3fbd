"""`leasebox migrate`, `leasebox enqueue` and `leasebox status`: the database-facing commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from leasebox.cli.common import add_database_options, kinds_list


def register(subparsers: Any) -> None:
    migrate = subparsers.add_parser(
        "migrate",
        help="create or upgrade the leasebox schema (idempotent, safe to run concurrently)",
        description="Apply the migrations not yet applied. Several pods may run this at once: "
        "an advisory lock serialises them.",
    )
    add_database_options(migrate)
    migrate.set_defaults(func=run_migrate)

    enqueue = subparsers.add_parser(
        "enqueue",
        help="enqueue one message (from flags, or a JSON object on stdin with --json)",
        description="Write one outbox row and print its receipt as JSON.",
    )
    add_database_options(enqueue)
    enqueue.add_argument("--kind", help="message kind, e.g. otp")
    enqueue.add_argument("--recipient", help="email address")
    enqueue.add_argument("--template", default="", help="template name (default: the kind)")
    enqueue.add_argument("--aggregate-id", help="business entity id, e.g. the user id")
    enqueue.add_argument(
        "--data", default="{}", help="template variables as a JSON object (default: {})"
    )
    enqueue.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a sensitive template variable, stored encrypted when keys are set (repeatable)",
    )
    enqueue.add_argument("--idempotency-key", help="makes a retried request the same send")
    enqueue.add_argument("--scope", help="namespace of the idempotency key (default: default)")
    enqueue.add_argument("--ttl", type=float, help="seconds after which it is never sent")
    enqueue.add_argument(
        "--replacement-key",
        metavar="KEY",
        help="supersede the older messages of this key not yet sent (resend code)",
    )
    enqueue.add_argument(
        "--max-attempts", type=int, help="attempt limit for this message (default: the worker's, 8)"
    )
    enqueue.add_argument(
        "--json", action="store_true", help="read the message as a JSON object from stdin"
    )
    enqueue.set_defaults(func=run_enqueue)

    status = subparsers.add_parser(
        "status",
        help="show the backlog per kind",
        description="Counts by state, oldest ages and send rate per kind.",
    )
    add_database_options(status)
    status.add_argument(
        "--kinds", type=kinds_list, help="comma-separated kinds (default: kinds with a backlog)"
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(func=run_status)


def run_migrate(args: argparse.Namespace) -> int:
    from leasebox.db.connections import redact_dsn, resolve_dsn
    from leasebox.db.migrations import migrate

    dsn = resolve_dsn(args.dsn)
    applied = migrate(dsn, args.schema)
    target = redact_dsn(dsn)
    if applied:
        for migration in applied:
            print(f"applied {migration.version:04d}_{migration.name} to {args.schema} ({target})")
    else:
        print(f"schema {args.schema} is up to date ({target})")
    return 0


def _message_fields(args: argparse.Namespace) -> dict[str, Any]:
    from datetime import UTC, datetime, timedelta

    from leasebox.errors import ConfigurationError

    if args.json:
        try:
            fields = json.loads(sys.stdin.read())
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"stdin is not valid JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise ConfigurationError("stdin must hold a JSON object")
        return fields
    try:
        data = json.loads(args.data)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"--data is not valid JSON: {exc}") from None
    secrets = {}
    for item in args.secret:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigurationError(f"--secret expects NAME=VALUE, got {name!r}")
        secrets[name] = value
    fields = {
        "kind": args.kind,
        "recipient": args.recipient,
        "template": args.template,
        "aggregate_id": args.aggregate_id,
        "data": data,
        "secrets": secrets,
        "max_attempts": args.max_attempts,
        "replacement_key": args.replacement_key,
    }
    if args.ttl is not None:
        fields["expires_at"] = datetime.now(UTC) + timedelta(seconds=args.ttl)
    return {k: v for k, v in fields.items() if v is not None}


def run_enqueue(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from leasebox.db.connections import check_migrated, connect, resolve_dsn
    from leasebox.errors import ConfigurationError
    from leasebox.messages import OutboxMessage
    from leasebox.producer.enqueue import enqueue

    fields = _message_fields(args)
    idempotency_key = fields.pop("idempotency_key", None) or args.idempotency_key
    scope = fields.pop("scope", None) or args.scope
    try:
        message = OutboxMessage.model_validate(fields)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid message: {describe_validation(exc)}") from None
    with connect(resolve_dsn(args.dsn)) as conn:
        check_migrated(conn, args.schema)
        receipt = enqueue(
            conn, message, idempotency_key=idempotency_key, scope=scope, schema=args.schema
        )
        conn.commit()
    print(receipt.model_dump_json())
    return 0


def describe_validation(exc: Any) -> str:
    """`field: problem; field: problem`, without echoing input values (they may be secret)."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "message"
        parts.append(f"{field}: {error['msg']}")
    return "; ".join(parts)


def run_status(args: argparse.Namespace) -> int:
    from leasebox.db.connections import check_migrated, connect, resolve_dsn
    from leasebox.store.backlog import fetch_backlog, known_kinds

    with connect(resolve_dsn(args.dsn), autocommit=True) as conn:
        check_migrated(conn, args.schema)
        kinds = args.kinds or known_kinds(conn, schema=args.schema)
        if not kinds:
            print("{}" if args.json else "no backlog: nothing pending, processing or dead")
            return 0
        backlog = fetch_backlog(conn, kinds, schema=args.schema)
    if args.json:
        kinds = {name: view.as_dict() for name, view in backlog.by_kind().items()}
        print(json.dumps({"total": backlog.as_dict(), "kinds": kinds}, indent=2))
        return 0
    header = (
        "KIND",
        "PENDING",
        "READY",
        "PROCESSING",
        "DEAD",
        "EXPIRED LEASES",
        "OLDEST PENDING",
        "SENT/S",
    )
    views = list(backlog.by_kind().items())
    rows = [
        (
            name,
            str(view.pending),
            str(view.ready),
            str(view.processing),
            str(view.dead),
            str(view.expired_leases),
            f"{view.oldest_pending_age_seconds:.1f}s",
            f"{view.sent_per_second:.2f}",
        )
        for name, view in [*views, ("(total)", backlog)]
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0
