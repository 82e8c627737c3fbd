"""`leasebox migrate`, `leasebox enqueue` and `leasebox status`: the database-facing commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from leasebox.cli.common import add_database_options, database, kinds_list

if TYPE_CHECKING:
    from leasebox.catalogue import Catalogue


def register(subparsers: Any) -> None:
    migrate = subparsers.add_parser(
        "migrate",
        help="create or upgrade the leasebox schema (idempotent, safe to run concurrently)",
        description="Apply the migrations not yet applied. Several pods may run this at once: "
        "an advisory lock serialises them.",
    )
    add_database_options(migrate)
    looking = migrate.add_mutually_exclusive_group()
    looking.add_argument(
        "--check",
        action="store_true",
        help="apply nothing; exit 1 if a migration is pending (for a deploy pipeline), 0 if "
        "the schema is up to date",
    )
    looking.add_argument(
        "--plan",
        action="store_true",
        help="apply nothing; print each pending migration and the SQL it would run",
    )
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
    enqueue.add_argument(
        "--kinds",
        type=kinds_list,
        help="kinds to accept besides the built-in ones, as the workers' --kinds "
        "(default: $LEASEBOX_KINDS)",
    )
    enqueue.add_argument(
        "--templates",
        metavar="DIR",
        help="the workers' templates directory: its templates are accepted besides the "
        "built-in ones (default: $LEASEBOX_TEMPLATES)",
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
    from leasebox.db.connections import redact_dsn
    from leasebox.db.migrations import migrate

    db = database(args)
    if args.check or args.plan:
        return _look_at_migrations(db.dsn, db.schema, plan=args.plan)
    applied = migrate(db.dsn, db.schema)
    target = redact_dsn(db.dsn)
    if applied:
        for migration in applied:
            print(f"applied {migration.version:04d}_{migration.name} to {db.schema} ({target})")
    else:
        print(f"schema {db.schema} is up to date ({target})")
    return 0


def _look_at_migrations(dsn: str, schema: str, *, plan: bool) -> int:
    """`migrate --check` and `--plan`: what `migrate` would apply, applying nothing."""
    from leasebox.db.connections import connect
    from leasebox.db.migrations import applied_versions, expected_schema_version, pending_migrations
    from leasebox.db.queries import compose
    from leasebox.errors import NotMigrated

    with connect(dsn, autocommit=True) as conn:
        pending = pending_migrations(conn, schema)
        newest = max(applied_versions(conn, schema), default=0)
        if plan:
            for migration in pending:
                print(f"-- {migration.version:04d}_{migration.name}")
                print(compose(migration.text(), schema).as_string(conn).strip() + "\n")
    names = [f"{m.version:04d}_{m.name}" for m in pending]
    if plan:
        print(
            f"-- {len(names)} migration(s) pending for schema {schema}"
            if names
            else f"-- schema {schema} is up to date: nothing to apply"
        )
        return 0
    if names:
        raise NotMigrated(schema, f"{len(names)} migration(s) pending: {', '.join(names)}")
    if newest > expected_schema_version():
        print(
            f"schema {schema} is at version {newest}, newer than this release's "
            f"{expected_schema_version()}: nothing to apply"
        )
    else:
        print(f"schema {schema} is up to date (version {newest})")
    return 0


def _message_fields(args: argparse.Namespace) -> dict[str, Any]:
    from datetime import UTC, datetime, timedelta

    from leasebox.errors import ConfigurationError

    if args.json:
        try:
            fields = json.loads(sys.stdin.read())
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"stdin is not valid JSON: {exc}") from None
        except RecursionError:
            raise ConfigurationError("stdin holds JSON nested too deeply") from None
        if not isinstance(fields, dict):
            raise ConfigurationError("stdin must hold a JSON object")
        return fields
    try:
        data = json.loads(args.data)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"--data is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigurationError("--data is nested too deeply") from None
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
    from leasebox.db.connections import check_migrated, connect
    from leasebox.messages import OutboxMessage
    from leasebox.producer.enqueue import enqueue

    fields = _message_fields(args)
    idempotency_key = fields.pop("idempotency_key", None) or args.idempotency_key
    scope = fields.pop("scope", None) or args.scope
    message = OutboxMessage.model_validate(fields)  # InvalidMessage: one line, exit 2
    catalogue = _catalogue(args)
    catalogue.check(message)  # before connecting: the same refusal as enqueue's
    db = database(args)
    with connect(db.dsn) as conn:
        check_migrated(conn, db.schema)
        receipt = enqueue(
            conn,
            message,
            idempotency_key=idempotency_key,
            scope=scope,
            schema=db.schema,
            catalogue=catalogue,
        )
        conn.commit()
    print(receipt.model_dump_json())
    return 0


def _catalogue(args: argparse.Namespace) -> Catalogue:
    """The built-in kinds and templates, and those the workers are configured with.

    The command has no application to declare its templates, so it takes what the workers
    take: their kinds, and the templates of their directory (whose variables it cannot know:
    a missing variable is left to the worker)."""
    from pathlib import Path

    from leasebox.catalogue import Catalogue
    from leasebox.errors import ConfigurationError

    catalogue = Catalogue()
    kinds = args.kinds
    variable = os.environ.get("LEASEBOX_KINDS", "").strip()
    if kinds is None and variable:
        try:
            kinds = kinds_list(variable)
        except argparse.ArgumentTypeError as exc:
            raise ConfigurationError(f"LEASEBOX_KINDS: {exc}") from None
    for kind in kinds or ():
        catalogue.register_kind(kind)
    templates = args.templates or os.environ.get("LEASEBOX_TEMPLATES", "").strip()
    if templates:
        catalogue.register_directory(Path(templates))
    return catalogue


def run_status(args: argparse.Namespace) -> int:
    from leasebox.db.connections import check_migrated, connect
    from leasebox.store.backlog import fetch_backlog, known_kinds

    db = database(args)
    with connect(db.dsn, autocommit=True) as conn:
        check_migrated(conn, db.schema)
        kinds = args.kinds or known_kinds(conn, schema=db.schema)
        if not kinds:
            print("{}" if args.json else "no backlog: nothing pending, processing or dead")
            return 0
        backlog = fetch_backlog(conn, kinds, schema=db.schema)
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
