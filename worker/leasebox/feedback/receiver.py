"""The receiver every face shares: which services it takes, and how one request is judged.

`Receivers` holds each service's secrets (a service without them is not served: 404) and the
suppression rules; `Receivers.from_env` reads them from `LEASEBOX_FEEDBACK_*` variables.
`accept` judges one request: size, signature (and time window), then the body's events in
leasebox's vocabulary; it raises `Refused` (a 4xx, or a 5xx when SNS cannot be reached to
check a certificate) or returns an `Accepted` for the face to store (`recording`) and
answer. An SNS subscription confirmation of an allowed topic is confirmed here and carries
no events. Nothing here logs what a request carried.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from leasebox import config
from leasebox.feedback import mailgun, postmark, resend, sendgrid, sns
from leasebox.feedback.events import BadPayload, FeedbackEvent
from leasebox.feedback.recording import Recorded
from leasebox.feedback.signing import Inbound, Refused
from leasebox.store.suppressions import DAY, SuppressionRules

SERVICES = ("ses", "sendgrid", "postmark", "mailgun", "resend")
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
PREFIX = "LEASEBOX_FEEDBACK_"
T = TypeVar("T")


@dataclass(frozen=True)
class Accepted:
    """A request whose signature holds: its events (none for a confirmation) and the token
    to remember against replays (Mailgun's)."""

    provider: str
    events: list[FeedbackEvent]
    token: str | None = None
    note: str = "accepted"


@dataclass(frozen=True)
class Receivers:
    """The services to receive, each with its secrets, and what the events may do."""

    ses: sns.SesSettings | None = None
    sendgrid: sendgrid.SendGridSettings | None = None
    postmark: postmark.PostmarkSettings | None = None
    mailgun: mailgun.MailgunSettings | None = None
    resend: resend.ResendSettings | None = None
    rules: SuppressionRules = field(default_factory=SuppressionRules)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @property
    def served(self) -> list[str]:
        return [name for name in SERVICES if getattr(self, name) is not None]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Receivers:
        """The services whose secrets are set (comma-separated lists, for rotation):

        `LEASEBOX_FEEDBACK_SES_TOPIC_ARNS`, `..._SENDGRID_PUBLIC_KEYS`,
        `..._POSTMARK_CREDENTIALS` (`user:password`), `..._MAILGUN_SIGNING_KEYS`,
        `..._RESEND_SECRETS`; the rules `..._HARD_BOUNCE_DAYS` (365),
        `..._SOFT_BOUNCE_LIMIT` (3), `..._SOFT_BOUNCE_WINDOW_HOURS` (72),
        `..._SOFT_BOUNCE_DAYS` (3), `..._PROVIDER_DAYS` (30); `..._MAX_BODY_BYTES`.
        A malformed value raises `ValueError` naming the variable.
        """
        env = os.environ if environ is None else environ

        def listed(name: str) -> tuple[str, ...]:
            return tuple(v.strip() for v in env.get(PREFIX + name, "").split(",") if v.strip())

        def number(name: str, default: float) -> float:
            text = env.get(PREFIX + name, "").strip()
            try:
                value = float(text) if text else default
            except ValueError:
                raise ValueError(f"{PREFIX}{name} must be a number, got {text!r}") from None
            if not value > 0:
                raise ValueError(f"{PREFIX}{name} must be positive")
            return value

        topics, keys = listed("SES_TOPIC_ARNS"), listed("SENDGRID_PUBLIC_KEYS")
        credentials = env.get(PREFIX + "POSTMARK_CREDENTIALS", "").strip()
        signing, secrets = listed("MAILGUN_SIGNING_KEYS"), listed("RESEND_SECRETS")
        return cls(
            ses=_named("SES_TOPIC_ARNS", lambda: sns.SesSettings(frozenset(topics)))
            if topics
            else None,
            sendgrid=_named("SENDGRID_PUBLIC_KEYS", lambda: sendgrid.SendGridSettings(keys))
            if keys
            else None,
            postmark=_named(
                "POSTMARK_CREDENTIALS",
                lambda: postmark.PostmarkSettings(postmark.read_credentials(credentials)),
            )
            if credentials
            else None,
            mailgun=_named("MAILGUN_SIGNING_KEYS", lambda: mailgun.MailgunSettings(signing))
            if signing
            else None,
            resend=_named("RESEND_SECRETS", lambda: resend.ResendSettings(secrets))
            if secrets
            else None,
            rules=SuppressionRules(
                hard_bounce_seconds=number("HARD_BOUNCE_DAYS", 365) * DAY,
                soft_bounce_limit=int(number("SOFT_BOUNCE_LIMIT", 3)),
                soft_bounce_window_seconds=number("SOFT_BOUNCE_WINDOW_HOURS", 72) * 3600,
                soft_bounce_seconds=number("SOFT_BOUNCE_DAYS", 3) * DAY,
                provider_seconds=number("PROVIDER_DAYS", config.FEEDBACK_PROVIDER_DAYS.default)
                * DAY,
            ),
            max_body_bytes=int(number("MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)),
        )


def _named(variable: str, make: Callable[[], T]) -> T:
    """`make()`, its `ValueError` naming the variable the value came from."""
    try:
        return make()
    except ValueError as exc:
        raise ValueError(f"{PREFIX}{variable}: {exc}") from None


def accept(receivers: Receivers, service: str, inbound: Inbound) -> Accepted:
    """Judge one request to `service`'s receiver; `Refused` says why not.

    Blocking for SES (a certificate or a subscription URL may be fetched from SNS)."""
    if service not in SERVICES or getattr(receivers, service) is None:
        raise Refused(404, "unknown_service")
    if len(inbound.body) > receivers.max_body_bytes:
        raise Refused(413, "too_large")
    try:
        return _accept(receivers, service, inbound)
    except BadPayload:
        raise Refused(400, "malformed") from None


def _accept(receivers: Receivers, service: str, inbound: Inbound) -> Accepted:
    if service == "ses" and receivers.ses is not None:
        message = sns.verify(inbound, receivers.ses)
        if message.type == "SubscriptionConfirmation":
            url = str(message.fields.get("SubscribeURL"))
            receivers.ses.certificates.confirm(url, message.region)
            return Accepted(service, [], note="subscribed")
        if message.type == "UnsubscribeConfirmation":
            return Accepted(service, [], note="unsubscribed")
        return Accepted(service, sns.parse(message))
    if service == "sendgrid" and receivers.sendgrid is not None:
        sendgrid.verify(inbound, receivers.sendgrid)
        return Accepted(service, sendgrid.parse(inbound.body))
    if service == "postmark" and receivers.postmark is not None:
        postmark.verify(inbound, receivers.postmark)
        return Accepted(service, postmark.parse(inbound.body))
    if service == "mailgun" and receivers.mailgun is not None:
        token = mailgun.verify(inbound, receivers.mailgun)
        return Accepted(service, mailgun.parse(inbound.body), token=token)
    if service == "resend" and receivers.resend is not None:
        resend.verify(inbound, receivers.resend)
        return Accepted(service, resend.parse(inbound.body))
    raise Refused(404, "unknown_service")


@dataclass(frozen=True)
class Reply:
    """What a face answers: a status, a short text body, extra headers."""

    status: int
    text: str
    headers: tuple[tuple[str, str], ...] = ()


def refusal(service: str, refused: Refused) -> Reply:
    """The answer to a refused request (basic auth asks for credentials on 401)."""
    headers: tuple[tuple[str, str], ...] = ()
    if refused.status == 401 and service == "postmark":
        headers = (("www-authenticate", 'Basic realm="leasebox"'),)
    return Reply(refused.status, refused.reason, headers)


def outcome(recorded: Recorded) -> Reply:
    """The answer once the events are stored: a replayed token is a 409 (Mailgun does not
    retry a 4xx it did not expect to succeed), anything else a 200."""
    if not recorded.fresh:
        return Reply(409, "replayed")
    return Reply(200, f"stored {len(recorded.stored)} of {recorded.received}")


STORAGE_FAILED = Reply(503, "storage_unavailable")


def label(service: str) -> str:
    """The service as a metric label: one of the five, or `unknown` (a path is anyone's)."""
    return service if service in SERVICES else "unknown"
