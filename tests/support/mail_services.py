"""Local stand-ins for the mail services, following each one's documented requests and answers.

Each stand-in is an aiohttp application on loopback that checks the credentials and the
request shape the service documents, records what it was sent, and answers by the
recipient's local part, with the service's documented status codes, headers and error
bodies:

    ok@...         accepted, with a message id in the service's place for it
    rejected@...   the service's refusal of that recipient (inactive, invalid, unverified)
    throttled@...  429 (and SES's TooManyRequestsException), with the service's rate headers
    down@...       the service's 5xx
    slow@...       no answer until the stand-in closes (a timeout)

A wrong key gets the service's authentication error. The Resend stand-in also keeps
idempotency keys as Resend does: a repeated key with the same body gets the first answer and
sends nothing; with a different body, 409 `invalid_idempotent_request`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

KEY = "test-api-key-7f3a9c"
AWS_ACCESS_KEY_ID = "AKIDLEASEBOXTEST01"
AWS_SECRET_ACCESS_KEY = "aws-secret-key-leasebox-test-0123456789"
# SendGrid's X-RateLimit-Reset and Resend's retry-after, in seconds from now.
THROTTLE_SECONDS = 42
SERVICES = ("sendgrid", "postmark", "mailgun", "resend", "ses")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class StandIn:
    """A running stand-in: its base URL, what it received, what it accepted."""

    service: str
    server: TestServer
    received: list[Received] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


Answer = Callable[[web.Request, StandIn], Awaitable[web.StreamResponse]]


def _local(address: str) -> str:
    return address.split("@", 1)[0].lower()


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None


# -- SendGrid: POST /v3/mail/send ----------------------------------------------------------------


def errors(message: str, field: str | None = None) -> dict[str, Any]:
    """SendGrid's error body."""
    return {"errors": [{"message": message, "field": field, "help": None}]}


def _shaped(body: Any, *paths: tuple[Any, ...]) -> Any:
    """The value at the first path of `body`, or None when any path is missing or empty."""
    values = []
    for path in paths:
        node = body
        for step in path:
            try:
                node = node[step]
            except (KeyError, IndexError, TypeError):
                return None
        if not node:
            return None
        values.append(node)
    return values[0]


async def sendgrid(
    request: web.Request, *, box: list[StandIn], hold: asyncio.Event
) -> web.Response:
    stand_in = box[0]
    body = await _json(request)
    stand_in.received.append(Received(request.path, dict(request.headers), body))
    if request.headers.get("Authorization") != f"Bearer {KEY}":
        return web.json_response(
            errors("The provided authorization grant is invalid, expired, or revoked"), status=401
        )
    recipient = _shaped(
        body,
        ("personalizations", 0, "to", 0, "email"),
        ("from", "email"),
        ("subject",),
        ("content", 0, "value"),
    )
    if recipient is None or _shaped(body, ("content", 0, "type")) != "text/plain":
        return web.json_response(errors("Bad Request", "personalizations"), status=400)
    local = _local(recipient)
    if local == "rejected":
        return web.json_response(
            errors(
                f"Does not contain a valid address: {recipient}", "personalizations.0.to.0.email"
            ),
            status=400,
        )
    if local == "throttled":
        reset = int(time.time()) + THROTTLE_SECONDS
        return web.json_response(
            errors("too many requests"),
            status=429,
            headers={
                "X-RateLimit-Limit": "600",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": str(reset),
            },
        )
    if local == "down":
        return web.json_response(errors("An internal server error occurred."), status=500)
    if local == "slow":
        await hold.wait()
    stand_in.delivered.append(recipient)
    return web.Response(status=202, headers={"X-Message-Id": uuid.uuid4().hex[:22]})


# -- Postmark: POST /email ------------------------------------------------------------------------


async def postmark(
    request: web.Request, *, box: list[StandIn], hold: asyncio.Event
) -> web.Response:
    stand_in = box[0]
    body = await _json(request)
    stand_in.received.append(Received(request.path, dict(request.headers), body))
    if request.headers.get("X-Postmark-Server-Token") != KEY:
        return web.json_response(
            {
                "ErrorCode": 10,
                "Message": "The Server Token you provided in the X-Postmark-Server-Token "
                "request header was invalid.",
            },
            status=401,
        )
    if not isinstance(body, dict) or not body.get("To") or not body.get("From"):
        return web.json_response({"ErrorCode": 300, "Message": "Invalid email request"}, status=422)
    recipient = str(body["To"])
    local = _local(recipient)
    if local == "rejected":
        return web.json_response(
            {
                "ErrorCode": 406,
                "Message": "You tried to send to recipient(s) that have been marked as inactive. "
                f"Found inactive addresses: {recipient}. Inactive recipients are ones that have "
                "generated a hard bounce, a spam complaint, or a manual suppression.",
            },
            status=422,
        )
    if local == "throttled":
        return web.json_response({"ErrorCode": 429, "Message": "Rate limit exceeded"}, status=429)
    if local == "down":
        return web.Response(status=500, text="Internal Server Error")
    if local == "slow":
        await hold.wait()
    stand_in.delivered.append(recipient)
    return web.json_response(
        {
            "To": recipient,
            "SubmittedAt": "2026-12-01T10:00:00.1234567-05:00",
            "MessageID": str(uuid.uuid4()),
            "ErrorCode": 0,
            "Message": "OK",
        }
    )


# -- Mailgun: POST /v3/{domain}/messages --------------------------------------------------


async def mailgun(request: web.Request, *, box: list[StandIn], hold: asyncio.Event) -> web.Response:
    stand_in = box[0]
    form = dict(await request.post())
    stand_in.received.append(Received(request.path, dict(request.headers), form))
    import base64

    expected = "Basic " + base64.b64encode(f"api:{KEY}".encode()).decode()
    if request.headers.get("Authorization") != expected:
        return web.Response(status=401, text="Forbidden")
    domain = request.match_info["domain"]
    if domain != "mg.example.com":
        return web.json_response({"message": f"Domain not found: {domain}"}, status=404)
    recipient = str(form.get("to", ""))
    if not recipient or not form.get("from") or not (form.get("text") or form.get("html")):
        return web.json_response({"message": "'from' parameter is missing"}, status=400)
    local = _local(recipient)
    if local == "rejected":
        return web.json_response(
            {"message": "to parameter is not a valid address. please check documentation"},
            status=400,
        )
    if local == "throttled":
        return web.json_response({"message": "Too many requests"}, status=429)
    if local == "down":
        return web.json_response({"message": "Internal Server Error"}, status=500)
    if local == "slow":
        await hold.wait()
    stand_in.delivered.append(recipient)
    return web.json_response(
        {
            "id": f"<20261201100000.{uuid.uuid4().hex[:12]}@{domain}>",
            "message": "Queued. Thank you.",
        }
    )


# -- Resend: POST /emails, with idempotency keys ---------------------------------------------


def error(status: int, name: str, message: str) -> web.Response:
    """Resend's error body."""
    body = {"statusCode": status, "name": name, "message": message}
    return web.json_response(body, status=status)


def resend_app_state() -> dict[str, tuple[str, Any]]:
    return {}


async def resend(
    request: web.Request,
    *,
    box: list[StandIn],
    hold: asyncio.Event,
    keys: dict[str, tuple[str, Any]],
) -> web.Response:
    stand_in = box[0]
    body = await _json(request)
    stand_in.received.append(Received(request.path, dict(request.headers), body))
    auth = request.headers.get("Authorization")
    if auth is None:
        return error(401, "missing_api_key", "Missing API key in the authorization header.")
    if auth != f"Bearer {KEY}":
        return error(403, "invalid_api_key", "API key is invalid.")
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 1 <= len(key) <= 256:
        return error(400, "invalid_idempotency_key", "The key must be between 1-256 chars.")
    fingerprint = json.dumps(body, sort_keys=True)
    if key is not None and key in keys:
        first, answer = keys[key]
        if first != fingerprint:
            return error(
                409,
                "invalid_idempotent_request",
                "Same idempotency key used with a different request payload.",
            )
        return web.json_response(answer)
    if not isinstance(body, dict) or not body.get("to") or not body.get("from"):
        return error(422, "missing_required_field", "Missing `to` field.")
    recipient = str(body["to"][0])
    local = _local(recipient)
    if local == "rejected":
        return error(422, "validation_error", f"Invalid `to` field. {recipient} is not valid.")
    if local == "throttled":
        return web.json_response(
            {"statusCode": 429, "name": "rate_limit_exceeded", "message": "Too many requests."},
            status=429,
            headers={
                "ratelimit-limit": "2",
                "ratelimit-remaining": "0",
                "ratelimit-reset": str(THROTTLE_SECONDS),
                "retry-after": str(THROTTLE_SECONDS),
            },
        )
    if local == "down":
        return error(500, "application_error", "An unexpected error occurred.")
    if local == "slow":
        await hold.wait()
    answer = {"id": str(uuid.uuid4())}
    if key is not None:
        keys[key] = (fingerprint, answer)
    stand_in.delivered.append(recipient)
    return web.json_response(answer)


# -- SES v2: POST /v2/email/outbound-emails (rest-json, SigV4) ------------------------------

_SIGV4 = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/"
    r"(?P<service>[a-z]+)/aws4_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)


def ses_error(status: int, code: str, message: str) -> web.Response:
    # SES v2 (rest-json) names the error in x-amzn-ErrorType and explains it in the body.
    return web.json_response(
        {"message": message},
        status=status,
        headers={"x-amzn-ErrorType": f"{code}:", "x-amzn-RequestId": str(uuid.uuid4())},
    )


async def ses(request: web.Request, *, box: list[StandIn], hold: asyncio.Event) -> web.Response:
    stand_in = box[0]
    body = await _json(request)
    stand_in.received.append(Received(request.path, dict(request.headers), body))
    signed = _SIGV4.match(request.headers.get("Authorization", ""))
    if signed is None or "X-Amz-Date" not in request.headers:
        return ses_error(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
    if signed["key"] != AWS_ACCESS_KEY_ID:
        return ses_error(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    if signed["service"] != "ses" or "host" not in signed["signed"].split(";"):
        return ses_error(
            403, "InvalidSignatureException", "The request signature we calculated does not match."
        )
    recipient = _shaped(
        body,
        ("Destination", "ToAddresses", 0),
        ("FromEmailAddress",),
        ("Content", "Simple", "Subject", "Data"),
    )
    if recipient is None:
        return ses_error(400, "BadRequestException", "Invalid request")
    local = _local(recipient)
    if local == "rejected":
        return ses_error(
            400,
            "MessageRejected",
            "Email address is not verified. The following identities failed the check in region "
            f"{signed['region'].upper()}: {recipient}",
        )
    if local == "throttled":
        return ses_error(429, "TooManyRequestsException", "Maximum sending rate exceeded.")
    if local == "down":
        return ses_error(500, "InternalFailure", "The request processing has failed.")
    if local == "slow":
        await hold.wait()
    stand_in.delivered.append(recipient)
    return web.json_response({"MessageId": f"0102{uuid.uuid4().hex}-000000"})


@asynccontextmanager
async def serve_stand_in(service: str) -> AsyncIterator[StandIn]:
    """Run the stand-in of `service` on a free loopback port."""
    hold = asyncio.Event()
    app = web.Application()
    box: list[StandIn] = []
    if service == "sendgrid":
        app.router.add_post("/v3/mail/send", partial(sendgrid, box=box, hold=hold))
    elif service == "postmark":
        app.router.add_post("/email", partial(postmark, box=box, hold=hold))
    elif service == "mailgun":
        app.router.add_post("/v3/{domain}/messages", partial(mailgun, box=box, hold=hold))
    elif service == "resend":
        keys = resend_app_state()
        app.router.add_post("/emails", partial(resend, box=box, hold=hold, keys=keys))
    elif service == "ses":
        app.router.add_post("/v2/email/outbound-emails", partial(ses, box=box, hold=hold))
    else:
        raise ValueError(service)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    stand_in = StandIn(service, server)
    box.append(stand_in)
    try:
        yield stand_in
    finally:
        hold.set()
        await server.close()


def provider_url(stand_in: StandIn, *, timeout: float = 5.0) -> str:
    """The provider URL that points leasebox at `stand_in`, its key passed by `token_env`."""
    base = (
        f"endpoint={stand_in.base}&from=Example%20%3Cno-reply%40example.com%3E&timeout={timeout:g}"
    )
    if stand_in.service == "ses":
        return f"ses://eu-west-1?{base}"
    if stand_in.service == "mailgun":
        return f"mailgun://eu/mg.example.com?{base}&token_env=LEASEBOX_TEST_API_KEY"
    return f"{stand_in.service}://?{base}&token_env=LEASEBOX_TEST_API_KEY"


AWS_SOURCES = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def use_stand_in_credentials(monkeypatch: Any) -> None:
    """The stand-ins' keys in the environment, and no other AWS source the SDK could try.

    Instance metadata is switched off so that the SDK never looks beyond this machine.
    """
    monkeypatch.setenv("LEASEBOX_TEST_API_KEY", KEY)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/leasebox-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/leasebox-aws-credentials")
    for name in AWS_SOURCES:
        monkeypatch.delenv(name, raising=False)
