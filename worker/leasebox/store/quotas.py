"""A provider account's send quota, shared through one row by every worker that uses it.

Mail services cap the send rate per account (Amazon SES starts at 14 messages a second), and
every worker of every pool that sends through the account shares the cap. Each worker asking
the provider and backing off on its own learns the limit once per worker; here the account's
tokens are handed out by the database instead, in one statement per reservation.

Why the rate holds. The account's row keeps one time, `next_at`: when its next token is due
(the generic cell rate algorithm, which is a token bucket written as a time). A reservation
of n tokens is one UPDATE of that row, so reservations of all workers are ordered by the
row's lock, and each takes the n due times that follow the previous one: the first at
`max(next_at, now - (burst - 1) / rate, paused_until)`, the others `1 / rate` apart, and
`next_at` moves past the last. Every due time handed out is thus at least `1 / rate` after
the one before it, except that after an idle spell up to `burst` of them may lie in the past
(due at once). A worker writes a message to the wire no earlier than its token's due time,
so in any interval of w seconds at most `rate * w + burst` messages go out, whichever worker
sends them. Due times are on the database's clock, read once the row is locked; a worker
places them on its own clock by the least delayed of its recent answers (a late one only
makes it send later). Measured at the provider, a message that took longer to get there
(a busy machine, a new connection) may arrive closer to the next than 1/rate; the pace over
the whole drain is the quota's. A token reserved
and not used (the message expired, or a newer one replaced it) is lost: the account then
sends a little under its rate, never over it.

`now` is None in production (the database's clock); tests pass a datetime.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from leasebox.db.queries import DEFAULT_SCHEMA, NOTIFY_CHANNEL, query_bytes
from leasebox.store.claiming import Connection


@dataclass(frozen=True)
class Reservation:
    """`count` tokens of an account: the first due at `first_at`, each next `spacing` later,
    all on the database's clock, which read `now` when it answered."""

    first_at: datetime
    spacing: timedelta
    count: int
    paused_until: datetime | None
    now: datetime

    def due(self, index: int) -> datetime:
        """When token `index` (from 0) of the reservation may be used."""
        return self.first_at + self.spacing * index


async def reserve_tokens(
    conn: Connection,
    *,
    account: str,
    rate: float,
    burst: int,
    count: int,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> Reservation:
    """Reserve `count` tokens of `account`, whose quota is `rate` messages a second with
    `burst` tokens of credit at most (the caller's settings become the account's)."""
    params = {"account": account, "rate": rate, "burst": burst, "count": count, "now": now}
    async with conn.cursor() as cur:
        await cur.execute(query_bytes("reserve_tokens", schema), params)
        row = await cur.fetchone()
    if row is None:  # an INSERT ... ON CONFLICT DO UPDATE always returns its row
        raise RuntimeError("reserve_tokens returned no row")
    first_at, paused_until, db_now = row
    return Reservation(first_at, timedelta(seconds=1 / rate), count, paused_until, db_now)


async def pause_quota(
    conn: Connection,
    *,
    account: str,
    seconds: float,
    schema: str = DEFAULT_SCHEMA,
    now: datetime | None = None,
) -> datetime | None:
    """Pause `account` for `seconds` from now (unless it is paused longer already) and notify
    the other workers; returns when the pause ends (None if the account has no row yet)."""
    params = {
        "account": account,
        "seconds": seconds,
        "now": now,
        "channel": NOTIFY_CHANNEL,
        "notice_prefix": _notice_prefix(schema),
        "separator": ":",
    }
    async with conn.cursor() as cur:
        await cur.execute(query_bytes("pause_quota", schema), params)
        row = await cur.fetchone()
    return None if row is None else row[0]


def pause_notice(payload: str, schema: str) -> tuple[str, float] | None:
    """`(account, paused until as epoch seconds)` from a NOTIFY payload `pause_quota` sent
    for `schema`, or None for any other payload."""
    prefix = _notice_prefix(schema)
    if not payload.startswith(prefix):
        return None
    epoch, separator, account = payload[len(prefix) :].partition(":")
    try:
        until = float(epoch)
    except ValueError:
        return None
    return (account, until) if separator and account else None


def _notice_prefix(schema: str) -> str:
    """What a pause notice starts with; an insert's notice is the schema's name alone."""
    return f"{schema}:quota:"
