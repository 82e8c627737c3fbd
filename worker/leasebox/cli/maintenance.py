"""`leasebox dead-letters list|requeue|purge` and `leasebox prune`: housekeeping by hand.

Dead letters are listed with ids, kinds, reasons and errors only (never a recipient or a
variable), requeued with a fresh attempt budget, or purged after an explicit `--yes`.
`prune` drops the days of sent messages, history and expired receipts past a retention (a
day partition at a time), keeping the unsent and dead messages of those days and those a live
receipt names, and refuses a retention shorter than the receipt TTL unless told otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from leasebox.cli.common import add_database_options, connect_migrated, kinds_list, positive_int


def register(subparsers: Any) -> None:
    dead = subparsers.add_parser(
        "dead-letters",
        help="list, requeue or purge dead letters",
        description="Work with messages that will not be sent without a decision.",
    )
    actions = dead.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="show dead letters, oldest first")
    requeue = actions.add_parser(
        "requeue", help="make dead letters pending again, with attempts reset"
    )
    purge = actions.add_parser("purge", help="delete dead letters (needs --yes)")
    for parser in (listing, requeue, purge):
        add_database_options(parser)
        parser.add_argument("--kind", type=kinds_list, help="comma-separated kinds")
        parser.add_argument(
            "--reason",
            help="dead reason: rejected, invalid_message, attempts_exhausted, expired, "
            "possibly_delivered",
        )
        parser.add_argument(
            "--error-class", help="the last error's class, e.g. smtp_550 or http_timeout"
        )
        parser.add_argument(
            "--older-than", metavar="DURATION", help="dead for longer than this, e.g. 1h or 7d"
        )
        parser.add_argument(
            "--newer-than", metavar="DURATION", help="dead for less than this, e.g. 15m or 1d"
        )
        parser.add_argument(
            "--id",
            type=_id_list,
            action="append",
            default=[],
            metavar="ID[,ID...]",
            help="only these outbox ids (repeatable)",
        )
        parser.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--limit", type=positive_int, default=100, help="default: 100")
    requeue.add_argument("--limit", type=positive_int, help="default: every match")
    purge.add_argument("--limit", type=positive_int, help="default: every match")
    requeue.add_argument(
        "--clear-expiry",
        action="store_true",
        help="also clear expires_at, so an expired OTP is sent late (a fresh code is better)",
    )
    purge.add_argument("--yes", action="store_true", help="confirm the deletion")
    listing.set_defaults(func=run_list)
    requeue.set_defaults(func=run_requeue)
    purge.set_defaults(func=run_purge)

    prune = subparsers.add_parser(
        "prune",
        help="drop the days of sent messages and expired receipts older than a retention",
        description="Drop each day of sent messages, their history and expired receipts once "
        "the whole day is older than the retention (a day partition at a time, in one short "
        "transaction). Messages of those days not sent yet, dead letters, and messages a "
        "live receipt names are moved first (once) to the kept partition, which is never "
        "dropped. Also creates the partitions of the coming days, and of past days whose "
        "rows wait in a default partition.",
    )
    add_database_options(prune)
    prune.add_argument("--retention", default="7d", help="keep this much history (default: 7d)")
    prune.add_argument(
        "--receipt-ttl",
        default="1d",
        metavar="DURATION",
        help="the longest receipt TTL your producers use; a shorter retention is refused "
        "(default: 1d, the producer's default)",
    )
    prune.add_argument(
        "--allow-short-retention",
        action="store_true",
        help="prune with a retention shorter than the receipt TTL (a request retried after "
        "its row is gone sends again)",
    )
    # Retention drops whole days now; the flag of the row-by-row deletes is accepted, unused.
    prune.add_argument("--batch-size", type=positive_int, help=argparse.SUPPRESS)
    prune.add_argument("--json", action="store_true", help="print JSON")
    prune.set_defaults(func=run_prune)


def _id_list(value: str) -> list[int]:
    try:
        ids = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected outbox ids like 12,13, got {value!r}") from None
    if not ids or min(ids) < 1:
        raise argparse.ArgumentTypeError(f"expected outbox ids like 12,13, got {value!r}")
    return ids


def _selection(args: argparse.Namespace) -> Any:
    from leasebox.cli.common import parse_duration
    from leasebox.store.dead_letters import DeadLetterFilter

    ids = tuple(i for group in args.id for i in group)
    return DeadLetterFilter(
        kinds=tuple(args.kind) if args.kind else None,
        reason=args.reason or None,
        error_class=args.error_class or None,
        older_than_seconds=parse_duration(args.older_than) if args.older_than else None,
        newer_than_seconds=parse_duration(args.newer_than) if args.newer_than else None,
        ids=ids or None,
        limit=args.limit,
    )


def run_list(args: argparse.Namespace) -> int:
    from leasebox.store.dead_letters import list_dead_letters

    selection = _selection(args)
    conn, schema = connect_migrated(args)
    with conn:
        letters = list_dead_letters(conn, selection, schema=schema)
    if args.json:
        print(json.dumps([letter.as_dict() for letter in letters], indent=2))
        return 0
    if not letters:
        print("no dead letters match")
        return 0
    header = ("ID", "KIND", "REASON", "ATTEMPTS", "ERROR CLASS", "DEAD SINCE", "ERROR")
    rows = [
        (
            str(letter.id),
            letter.kind,
            letter.dead_reason or "",
            str(letter.attempts),
            letter.last_error_class or "",
            letter.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
            (letter.last_error or "")[:80],
        )
        for letter in letters
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def run_requeue(args: argparse.Namespace) -> int:
    from leasebox.store.dead_letters import requeue_dead_letters

    selection = _selection(args)
    conn, schema = connect_migrated(args)
    with conn:
        ids = requeue_dead_letters(conn, selection, clear_expiry=args.clear_expiry, schema=schema)
    if args.json:
        print(json.dumps({"requeued": ids}))
    else:
        print(f"requeued {len(ids)} dead letters" + (f": {_short(ids)}" if ids else ""))
    return 0


def run_purge(args: argparse.Namespace) -> int:
    from leasebox.errors import ConfigurationError
    from leasebox.store.dead_letters import count_dead_letters, purge_dead_letters

    selection = _selection(args)
    conn, schema = connect_migrated(args)
    with conn:
        if not args.yes:
            count = count_dead_letters(conn, selection, schema=schema)
            raise ConfigurationError(
                f"purge would delete {count} dead letters for good; pass --yes to confirm"
            )
        deleted = purge_dead_letters(conn, selection, schema=schema)
    print(json.dumps({"purged": deleted}) if args.json else f"purged {deleted} dead letters")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from leasebox.cli.common import parse_duration
    from leasebox.errors import DatabaseError
    from leasebox.store.pruning import prune

    retention = parse_duration(args.retention)
    receipt_ttl = parse_duration(args.receipt_ttl)
    if args.batch_size is not None:
        print(
            "leasebox prune: --batch-size is no longer used: retention drops whole days",
            file=sys.stderr,
        )
    conn, schema = connect_migrated(args)
    with conn:
        result = prune(
            conn,
            retention_seconds=retention,
            schema=schema,
            receipt_ttl_seconds=receipt_ttl,
            allow_short_retention=args.allow_short_retention,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "sent": result.sent,
                    "receipts": result.receipts,
                    "kept": result.kept,
                    "events": result.events,
                    "partitions": list(result.partitions),
                    "problem": result.problem,
                }
            )
        )
    else:
        print(
            f"pruned {result.sent} sent messages and {result.receipts} expired receipts "
            f"({len(result.partitions)} day partitions dropped); kept {result.kept} messages "
            "of those days that are not sent, dead, or named by a live receipt; "
            f"deleted {result.events} provider events"
        )
    if result.problem:
        # The days were dropped; what the partition upkeep could not do is a failure to retry.
        raise DatabaseError(result.problem)
    return 0


def _short(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:20])
    return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
