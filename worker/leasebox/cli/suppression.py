"""`leasebox suppression list|add|remove|import`: the suppression list by hand.

Entries are shown with their scope, mailbox, reason and expiry; the mailbox is the address
as the list keys it (`leasebox.addresses.mailbox_key`), which is the recipient, so listing
is for people who may read recipients (the list needs `--show-recipients`, else it masks
them as the trace does). `import` reads one address per line (or CSV rows
`address,reason,expires_at,detail`), so a provider's own suppression export can seed it.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from leasebox.cli.common import (
    add_database_options,
    connect_migrated,
    parse_duration,
    positive_int,
)
from leasebox.errors import ConfigurationError
from leasebox.store.suppressions import REASONS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "suppression",
        help="list, add, remove or import suppression-list entries",
        description="The mailboxes a scope must not mail: workers end a message to one "
        "`suppressed` when they claim it, unsent.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="show entries, newest first")
    add = actions.add_parser("add", help="put an address on a scope's list (replaces its entry)")
    remove = actions.add_parser("remove", help="take an address off a scope's list")
    importing = actions.add_parser(
        "import", help="add many: one address a line, or CSV address,reason,expires_at,detail"
    )
    for sub in (listing, add, remove, importing):
        add_database_options(sub)
        sub.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--scope", help="only this scope")
    listing.add_argument("--address", help="only this address's mailbox")
    listing.add_argument("--reason", choices=REASONS, help="only this reason")
    listing.add_argument("--expired", action="store_true", help="include expired entries")
    listing.add_argument("--limit", type=positive_int, default=100, help="default: 100")
    listing.add_argument("--show-recipients", action="store_true", help="print mailboxes unmasked")
    for sub in (add, remove, importing):
        sub.add_argument("--scope", default="default", help="the producer's scope (default)")
    for sub in (add, remove):
        sub.add_argument("address", help="the address (any spelling of the mailbox)")
    for sub in (add, importing):
        sub.add_argument(
            "--reason", choices=REASONS, default="manual", help="why (default: manual)"
        )
        sub.add_argument(
            "--expires-in", metavar="DURATION", help="e.g. 30d (default: until removed)"
        )
    add.add_argument("--detail", help="a note kept with the entry")
    importing.add_argument(
        "file", type=argparse.FileType("r", encoding="utf-8"), help="a file, or - for stdin"
    )
    listing.set_defaults(func=run_list)
    add.set_defaults(func=run_add)
    remove.set_defaults(func=run_remove)
    importing.set_defaults(func=run_import)


def _masked(mailbox: str) -> str:
    local, _, domain = mailbox.rpartition("@")
    return f"{local[:1]}***@{domain}"


def run_list(args: argparse.Namespace) -> int:
    from leasebox.store.suppressions import list_suppressions

    conn, schema = connect_migrated(args)

    with conn:
        entries = list_suppressions(
            conn,
            scope=args.scope,
            address=args.address,
            reason=args.reason,
            expired=args.expired,
            limit=args.limit,
            schema=schema,
        )
    shown = [e.as_dict() for e in entries]
    if not args.show_recipients:
        for entry in shown:
            entry["recipient_key"] = _masked(entry["recipient_key"])
    if args.json:
        print(json.dumps(shown, indent=2))
        return 0
    if not shown:
        print("no suppression-list entries match")
        return 0
    header = ("SCOPE", "MAILBOX", "REASON", "SINCE", "UNTIL", "DETAIL")
    rows = [
        (
            e["scope"],
            e["recipient_key"],
            e["reason"],
            e["created_at"][:19],
            (e["expires_at"] or "removed by hand")[:19],
            (e["detail"] or "")[:60],
        )
        for e in shown
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _expiry(text: str | None) -> datetime | None:
    return datetime.now(UTC) + timedelta(seconds=parse_duration(text)) if text else None


def run_add(args: argparse.Namespace) -> int:
    from leasebox.store.suppressions import Entry, add_suppressions

    entry = Entry(args.address, args.scope, args.reason, args.detail, _expiry(args.expires_in))
    conn, schema = connect_migrated(args)
    with conn:
        add_suppressions(conn, [entry], schema=schema)
    print(json.dumps({"added": 1}) if args.json else f"suppressed in scope {args.scope!r}")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    from leasebox.store.suppressions import remove_suppression

    conn, schema = connect_migrated(args)

    with conn:
        reason = remove_suppression(conn, args.address, scope=args.scope, schema=schema)
        conn.commit()
    if args.json:
        print(json.dumps({"removed": reason is not None, "reason": reason}))
    elif reason is None:
        print(f"not on the list of scope {args.scope!r}")
    else:
        print(f"removed from scope {args.scope!r} (it was {reason})")
    return 0


def read_entries(source: TextIO, scope: str, reason: str, expires_at: datetime | None) -> list[Any]:
    """The entries of an import file: `address` or `address,reason,expires_at,detail` per
    line; blank lines and lines starting with `#` are skipped; a bad line stops the import
    with its line number (nothing is written)."""
    from leasebox.store.suppressions import Entry

    entries = []
    for number, row in enumerate(csv.reader(source), start=1):
        if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
            continue
        cells = [cell.strip() for cell in row] + [""] * 3
        try:
            until = datetime.fromisoformat(cells[2]) if cells[2] else expires_at
            if until is not None and until.tzinfo is None:
                until = until.replace(tzinfo=UTC)
            entries.append(Entry(cells[0], scope, cells[1] or reason, cells[3] or None, until))
        except (ValueError, ConfigurationError) as exc:
            raise ConfigurationError(f"line {number}: {exc}") from None
    return entries


def run_import(args: argparse.Namespace) -> int:
    from leasebox.store.suppressions import add_suppressions

    with args.file:
        entries = read_entries(args.file, args.scope, args.reason, _expiry(args.expires_in))
    conn, schema = connect_migrated(args)
    with conn:
        written = add_suppressions(conn, entries, schema=schema)
    if args.json:
        print(json.dumps({"imported": written}))
    else:
        print(f"imported {written} entries into scope {args.scope!r}", file=sys.stdout)
    return 0
