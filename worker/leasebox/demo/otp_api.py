"""A reference OTP HTTP API: how an application is meant to use the outbox.

`POST /otp/email` creates a login challenge and enqueues its email in *one* transaction, so a
challenge never exists without its email and an email never goes out for a challenge that was
rolled back. The `Idempotency-Key` header is required: a client that retries after a timeout
gets the same challenge back (200) instead of a second code in the user's inbox, and a key
reused for a different body is refused (422) rather than silently answered with someone
else's challenge. The code is drawn with `secrets`, stored only as a keyed hash, and travels
to the worker only inside the outbox's encrypted `secrets`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from aiohttp import web
from psycopg_pool import AsyncConnectionPool
from pydantic import TypeAdapter, ValidationError

from leasebox.db.queries import DEFAULT_SCHEMA, SqlFile, query, validate_schema_name
from leasebox.errors import IdempotencyConflict, RateLimited
from leasebox.messages import EmailAddress, OutboxMessage
from leasebox.producer.enqueue import enqueue_async
from leasebox.producer.guard import AbuseGuard

SQL_FILE = SqlFile("leasebox.demo", "otp_api.sql")
IDEMPOTENCY_HEADER = "Idempotency-Key"
_USER_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,100}$")
_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
_EMAIL = TypeAdapter(EmailAddress)
_BODY_FIELDS = frozenset({"email", "user_id"})


@dataclass(frozen=True)
class OtpApiSettings:
    """How the API issues challenges.

    schema: where the API keeps its `challenges` table (its own, not leasebox's).
    outbox_schema: the leasebox schema it enqueues into.
    scope: the idempotency scope of its keys (keys of other APIs never collide with it).
    code_digits: length of the numeric code.
    ttl_seconds: how long a code is valid; the email is dead-lettered, never sent, after it.
    guard: optional per-recipient / per-scope limits (429 with Retry-After).
    pepper: the key of the code hash, so a leaked table does not give the codes away.
    product_name: shown in the email.
    """

    schema: str = "demo"
    outbox_schema: str = DEFAULT_SCHEMA
    scope: str = "otp_email"
    code_digits: int = 6
    ttl_seconds: float = 600.0
    guard: AbuseGuard | None = None
    pepper: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    product_name: str = "leasebox demo"

    def __post_init__(self) -> None:
        validate_schema_name(self.schema)
        validate_schema_name(self.outbox_schema)
        if not 4 <= self.code_digits <= 12:
            raise ValueError("code_digits must be between 4 and 12")
        if self.ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")


POOL_KEY = web.AppKey("pool", AsyncConnectionPool)
SETTINGS_KEY = web.AppKey("settings", OtpApiSettings)


def code_digest(pepper: bytes, challenge_id: uuid.UUID | str, code: str) -> str:
    """The stored form of a code: an HMAC bound to its challenge."""
    message = f"{challenge_id}:{code}".encode()
    return hmac.new(pepper, message, hashlib.sha256).hexdigest()


def new_code(digits: int) -> str:
    return "".join(secrets.choice("0123456789") for _ in range(digits))


async def create_schema(conn: psycopg.AsyncConnection[Any], schema: str = "demo") -> None:
    """Create the API's schema and table if missing (idempotent)."""
    await conn.execute(query("create_challenges", schema, SQL_FILE))


class BadRequest(Exception):
    """A request the API refuses with 400; `field` names what to fix."""

    def __init__(self, message: str, field_name: str | None) -> None:
        super().__init__(message)
        self.field_name = field_name


@dataclass(frozen=True)
class ChallengeRequest:
    email: str
    user_id: str | None

    def request_hash(self) -> str:
        canonical = json.dumps({"email": self.email, "user_id": self.user_id}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()


def parse_request(body: Any) -> ChallengeRequest:
    """Validate a decoded JSON body; raise `BadRequest` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", None)
    unknown = sorted(set(body) - _BODY_FIELDS)
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}", unknown[0])
    raw_email = body.get("email")
    if not isinstance(raw_email, str):
        raise BadRequest("email is required and must be a string", "email")
    try:
        email_address = _EMAIL.validate_python(raw_email)
    except ValidationError:
        raise BadRequest("email is not a valid email address", "email") from None
    user_id = body.get("user_id")
    if user_id is not None and (not isinstance(user_id, str) or not _USER_ID.fullmatch(user_id)):
        raise BadRequest("user_id must be 1 to 100 letters, digits or any of _.:@-", "user_id")
    return ChallengeRequest(email=email_address, user_id=user_id)


def _error(status: int, message: str, field_name: str | None = None) -> web.Response:
    payload: dict[str, Any] = {"error": message}
    if field_name is not None:
        payload["field"] = field_name
    return web.json_response(payload, status=status)


async def issue_challenge(
    conn: psycopg.AsyncConnection[Any],
    request: ChallengeRequest,
    idempotency_key: str,
    settings: OtpApiSettings,
) -> tuple[str, datetime, bool]:
    """Create a challenge and enqueue its email in the open transaction of `conn`.

    Returns (challenge id, expiry, replayed). Never commits: the caller's transaction decides.
    """
    challenge_id = uuid.uuid4()
    code = new_code(settings.code_digits)
    expires_at = datetime.now(UTC) + timedelta(seconds=settings.ttl_seconds)
    message = OutboxMessage(
        kind="otp",
        recipient=request.email,
        aggregate_id=request.user_id,
        data={
            "minutes_valid": max(1, math.floor(settings.ttl_seconds / 60)),
            "product_name": settings.product_name,
        },
        secrets={"code": code},
        delivery_key=f"otp:{request.user_id or 'anonymous'}:{challenge_id}",
        expires_at=expires_at,
    )
    receipt = await enqueue_async(
        conn,
        message,
        idempotency_key=idempotency_key,
        scope=settings.scope,
        request_hash=request.request_hash(),
        guard=settings.guard,
        schema=settings.outbox_schema,
    )
    if receipt.reused:
        cur = await conn.execute(
            query("find_challenge_by_outbox", settings.schema, SQL_FILE),
            {"outbox_id": receipt.outbox_id},
        )
        found = await cur.fetchone()
        if found is None:
            raise LookupError(f"outbox row {receipt.outbox_id} has no challenge")
        return str(found[0]), found[1], True
    await conn.execute(
        query("insert_challenge", settings.schema, SQL_FILE),
        {
            "id": challenge_id,
            "outbox_id": receipt.outbox_id,
            "email": request.email,
            "user_id": request.user_id,
            "code_hash": code_digest(settings.pepper, challenge_id, code),
            "expires_at": expires_at,
        },
    )
    return str(challenge_id), expires_at, False


async def post_email_challenge(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS_KEY]
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if not key:
        return _error(400, f"the {IDEMPOTENCY_HEADER} header is required", IDEMPOTENCY_HEADER)
    if not _KEY.fullmatch(key):
        return _error(
            400, f"{IDEMPOTENCY_HEADER} must be 1 to 200 printable characters", IDEMPOTENCY_HEADER
        )
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the body is not valid JSON")
    try:
        parsed = parse_request(body)
    except BadRequest as exc:
        return _error(400, str(exc), exc.field_name)
    try:
        async with request.app[POOL_KEY].connection() as conn, conn.transaction():
            challenge_id, expires_at, replayed = await issue_challenge(conn, parsed, key, settings)
    except IdempotencyConflict:
        return _error(422, f"this {IDEMPOTENCY_HEADER} was already used with a different request")
    except RateLimited as exc:
        response = _error(429, f"too many codes requested ({exc.limit_name} limit)")
        response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        return response
    payload = {
        "challenge_id": challenge_id,
        "expires_at": expires_at.isoformat(),
        "replayed": replayed,
    }
    response = web.json_response(payload, status=200 if replayed else 201)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


async def get_challenge(request: web.Request) -> web.Response:
    """The challenge and the delivery state of its email (never the code)."""
    settings = request.app[SETTINGS_KEY]
    try:
        challenge_id = uuid.UUID(request.match_info["challenge_id"])
    except ValueError:
        return _error(404, "no such challenge")
    async with request.app[POOL_KEY].connection() as conn:
        cur = await conn.execute(
            query("get_challenge", settings.schema, SQL_FILE), {"id": challenge_id}
        )
        found = await cur.fetchone()
        if found is None:
            return _error(404, "no such challenge")
        cur = await conn.execute(query("get_message", settings.outbox_schema), {"id": found[1]})
        message = await cur.fetchone()
        columns = [c.name for c in cur.description or ()]
    outbox = dict(zip(columns, message, strict=True)) if message else {}
    return web.json_response(
        {
            "challenge_id": str(found[0]),
            "created_at": found[2].isoformat(),
            "expires_at": found[3].isoformat(),
            "email_status": outbox.get("status"),
            "attempts": outbox.get("attempts"),
            "sent_at": outbox["sent_at"].isoformat() if outbox.get("sent_at") else None,
        }
    )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def build_app(pool: AsyncConnectionPool, settings: OtpApiSettings) -> web.Application:
    """The aiohttp application; the caller owns the pool (opened before, closed after)."""
    app = web.Application()
    app[POOL_KEY] = pool
    app[SETTINGS_KEY] = settings
    app.router.add_post("/otp/email", post_email_challenge)
    app.router.add_get("/otp/challenges/{challenge_id}", get_challenge)
    app.router.add_get("/healthz", healthz)
    return app
