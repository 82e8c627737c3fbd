"""The actions a person can take from `leasebox web`, and the audit trail they leave.

An action is a name, the page whose filter it applies to, a preview (how many rows it would
touch, in words) and a run; the application gives each the same path: a POST to
`/actions/<name>` with a CSRF token, refused in read-only mode and without the operator
role, previewed first, then confirmed, then written to the `audit` table with who and when,
whether it was done or refused. A new action (lifting a suppression, say) is one more
`Action` handed to `register`, with a page of its own for `page`: the application needs no
other change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from leasebox.db.queries import query
from leasebox.store.dead_letters import (
    count_dead_letters,
    purge_dead_letters,
    requeue_dead_letters,
)
from leasebox.web.reading import FILTER_FIELDS, WEB_SQL, dead_letter_query

# What an action came to: the audit trail's `outcome` column.
ActionResult = Literal["done", "refused", "failed"]
Connection = psycopg.Connection[Any]
Form = Mapping[str, str]


@dataclass(frozen=True)
class Action:
    """One thing a person may do to the outbox from a page.

    `fields` are the form fields it reads (echoed by the preview, kept in the audit row);
    `preview` says how many rows it would touch and what it does to them, `run` does it and
    returns how many it touched; both raise `ConfigurationError` for a bad field.
    """

    name: str
    label: str
    page: str
    fields: tuple[str, ...]
    preview: Callable[[Connection, Form, str], tuple[int, str]]
    run: Callable[[Connection, Form, str], int]
    done: str


ACTIONS: dict[str, Action] = {}


def register(action: Action) -> Action:
    """Offer `action` on its page (by name; a second registration replaces the first)."""
    ACTIONS[action.name] = action
    return action


def actions_of(page: str) -> list[Action]:
    return [action for action in ACTIONS.values() if action.page == page]


def _letters(count: int) -> str:
    return f"{count} dead letter{'' if count == 1 else 's'}"


def _matching(conn: Connection, form: Form, schema: str) -> int:
    return count_dead_letters(conn, dead_letter_query(form).selection, schema=schema)


def _requeue_preview(conn: Connection, form: Form, schema: str) -> tuple[int, str]:
    count = _matching(conn, form, schema)
    return count, (
        f"Requeue {_letters(count)}: each becomes pending with a fresh attempt budget. An OTP "
        "already past its expiry is dead-lettered again as expired, never sent late."
    )


def _requeue(conn: Connection, form: Form, schema: str) -> int:
    return len(requeue_dead_letters(conn, dead_letter_query(form).selection, schema=schema))


def _purge_preview(conn: Connection, form: Form, schema: str) -> tuple[int, str]:
    count = _matching(conn, form, schema)
    return count, (
        f"Delete {_letters(count)} for good, with their attempt history and receipts. A "
        "request retried later with the same idempotency key is sent anew."
    )


def _purge(conn: Connection, form: Form, schema: str) -> int:
    return purge_dead_letters(conn, dead_letter_query(form).selection, schema=schema)


register(
    Action(
        name="requeue",
        label="Requeue",
        page="dead-letters",
        fields=FILTER_FIELDS,
        preview=_requeue_preview,
        run=_requeue,
        done="requeued",
    )
)
register(
    Action(
        name="purge",
        label="Purge",
        page="dead-letters",
        fields=FILTER_FIELDS,
        preview=_purge_preview,
        run=_purge,
        done="purged",
    )
)


@dataclass(frozen=True)
class AuditEntry:
    """One row of the audit trail."""

    id: int
    at: datetime
    actor: str
    action: str
    outcome: str
    selection: dict[str, Any]
    affected: int
    detail: str | None


def record(
    conn: Connection,
    *,
    actor: str,
    action: str,
    outcome: ActionResult,
    selection: Mapping[str, str],
    affected: int = 0,
    detail: str | None = None,
    schema: str,
) -> int:
    """Write one row of the audit trail and commit it; returns its id."""
    row = conn.execute(
        query("record_action", schema, WEB_SQL),
        {
            "actor": actor,
            "action": action,
            "outcome": outcome,
            "selection": Jsonb(dict(selection)),
            "affected": affected,
            "detail": detail,
        },
    ).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def recent(conn: Connection, *, schema: str, limit: int = 200) -> list[AuditEntry]:
    """The latest rows of the audit trail, newest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("list_actions", schema, WEB_SQL), {"limit": limit}).fetchall()
    return [AuditEntry(**row) for row in rows]
