"""Postmark (`postmark://`): the Email API.

POST `/email` with `X-Postmark-Server-Token`; 200 with `{"MessageID", "ErrorCode": 0, ...}`.
A refused message is HTTP 422 with `{"ErrorCode": n, "Message": ...}`, and the code says
why: 406 the recipient is inactive (hard-bounced, complained or suppressed), 300 an invalid
request (a malformed address, no body), 411 a forbidden attachment: permanent. 400/401 the
sender signature is missing or unconfirmed, 405 the account may not send (no credits), 412
the account is pending approval, 413 it may not send, 10 a bad token: the account's
problem, retried (and alerted on) rather than dead-lettering every message. HTTP 401 is a
bad token, 429 the rate limit, 500 and 503 (maintenance) Postmark's own trouble.

Postmark has no idempotency key: a send repeated after a lost lease is a second email. The
delivery key goes into `Metadata` (in its webhooks and activity, for finding the duplicate;
values hold 80 characters, so a longer key is sent as its digest) and its digest into the
`X-Leasebox-Key` header.
"""

from __future__ import annotations

from typing import Any

from leasebox.delivery.providers.base import Email, RequestOutcome, key_digest
from leasebox.delivery.providers.mail_api import (
    KEY_HEADER,
    ApiAnswer,
    ApiRequest,
    MailApiProvider,
    settings_for,
    status_error,
)
from leasebox.delivery.providers.urls import UrlOption, parse_provider_url
from leasebox.errors import ConfigurationError, ProviderError

VARIABLES = ("POSTMARK_SERVER_TOKEN", "POSTMARK_API_TOKEN")
BASE = "https://api.postmarkapp.com"
METADATA_VALUE_LIMIT = 80
DEFAULT_STREAM = "outbound"
URL_OPTIONS = (
    UrlOption("stream", f"`{DEFAULT_STREAM}`", "the Postmark message stream to send through"),
)
# Postmark's API error codes: those that reject the message, and those about the account.
REJECTING = frozenset({300, 402, 403, 406, 409, 411})
ACCOUNT = frozenset({10, 400, 401, 405, 412, 413})
KNOWN = REJECTING | ACCOUNT | {100, 429}


class PostmarkProvider(MailApiProvider):
    name = "postmark"
    idempotent = False

    def auth_headers(self) -> dict[str, str]:
        return {"X-Postmark-Server-Token": self.settings.token}

    def build(self, email: Email) -> ApiRequest:
        key = email.delivery_key
        if len(key) > METADATA_VALUE_LIMIT:
            key = key_digest(key)
        body: dict[str, Any] = {
            "From": self.settings.sender,
            "To": email.recipient,
            "Subject": email.subject,
            "TextBody": email.text,
            "MessageStream": self.settings.options.get("stream", DEFAULT_STREAM),
            "Tag": email.kind,
            "Headers": [{"Name": KEY_HEADER, "Value": key_digest(email.delivery_key)}],
            "Metadata": {"leasebox_key": key, "leasebox_outbox_id": str(email.outbox_id)},
        }
        if email.html:
            body["HtmlBody"] = email.html
        return ApiRequest(json=body)

    def accepted(self, answer: ApiAnswer) -> bool:
        return 200 <= answer.status < 300 and _error_code(answer) in (None, 0)

    def message_id(self, answer: ApiAnswer) -> str | None:
        found = answer.body.get("MessageID") if isinstance(answer.body, dict) else None
        return str(found) if isinstance(found, str) and found else None

    def classify(self, answer: ApiAnswer) -> ProviderError:
        code = _error_code(answer)
        label = str(code) if code in KNOWN else None
        if code in REJECTING:
            return status_error(self.name, answer, code=label, outcome=RequestOutcome.REJECTED)
        if code in ACCOUNT:
            return status_error(
                self.name, answer, code=label, permanent=False, outcome=RequestOutcome.ACCOUNT
            )
        if code == 429:
            return status_error(self.name, answer, code=label, outcome=RequestOutcome.THROTTLED)
        if code == 100:  # maintenance
            return status_error(self.name, answer, code=label, outcome=RequestOutcome.UNAVAILABLE)
        return status_error(self.name, answer)


def _error_code(answer: ApiAnswer) -> int | None:
    found = answer.body.get("ErrorCode") if isinstance(answer.body, dict) else None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def postmark_provider_from_url(url: str, timeout: float) -> PostmarkProvider:
    """`postmark://?from=...` (option `stream`: the message stream, default `outbound`)."""
    parsed = parse_provider_url(url)
    if parsed.host or parsed.port or parsed.path not in ("", "/"):
        raise ConfigurationError(
            "postmark:// provider URL takes no host or path: postmark://?from=...&stream=..."
        )
    return PostmarkProvider(
        settings_for(
            parsed,
            base=BASE,
            path="/email",
            variables=VARIABLES,
            timeout=timeout,
            options=URL_OPTIONS,
        )
    )
