"""SendGrid (`sendgrid://`, `sendgrid://eu`): the v3 Mail Send API.

POST `/v3/mail/send` with a bearer key; 202 Accepted with an empty body and the message id in
`X-Message-Id`. Errors are `{"errors": [{"message", "field", "help"}]}`: 400 a request SendGrid
will not send (a sender that is not a verified identity, a malformed address), 401 a bad key,
403 a key without the Mail Send permission or a temporary block, 413 too large, 429 the rate
limit (`X-RateLimit-Reset` is when it resets, a Unix time), 5xx its own trouble.

SendGrid has no idempotency key: a send repeated after a lost lease is a second email. The
delivery key travels as `custom_args` (shown in its Event Webhook and activity feed, for
finding the duplicate) and its digest as the `X-Leasebox-Key` header. Suppressed addresses
(bounces, unsubscribes) are accepted with 202 and dropped later, so they show up in the Event
Webhook rather than here.
"""

from __future__ import annotations

from email.utils import parseaddr
from typing import Any

from leasebox.delivery.providers.base import Email, key_digest
from leasebox.delivery.providers.mail_api import (
    KEY_HEADER,
    ApiAnswer,
    ApiRequest,
    MailApiProvider,
    _token,
    seconds_until,
    settings_for,
    status_error,
)
from leasebox.delivery.providers.urls import parse_provider_url
from leasebox.errors import ConfigurationError, ProviderError

VARIABLES = ("SENDGRID_API_KEY",)
BASES = {"": "https://api.sendgrid.com", "eu": "https://api.eu.sendgrid.com"}


class SendGridProvider(MailApiProvider):
    name = "sendgrid"
    idempotent = False

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.token}"}

    def build(self, email: Email) -> ApiRequest:
        name, address = parseaddr(self.settings.sender)
        sender: dict[str, str] = {"email": address}
        if name:
            sender["name"] = name
        content = [{"type": "text/plain", "value": email.text}]
        if email.html:
            content.append({"type": "text/html", "value": email.html})
        body: dict[str, Any] = {
            "personalizations": [{"to": [{"email": email.recipient}]}],
            "from": sender,
            "subject": email.subject,
            "content": content,
            "headers": {KEY_HEADER: key_digest(email.delivery_key)},
            "custom_args": {
                "leasebox_delivery_key": email.delivery_key,
                "leasebox_outbox_id": str(email.outbox_id),
            },
            "categories": [email.kind],
        }
        return ApiRequest(json=body)

    def message_id(self, answer: ApiAnswer) -> str | None:
        return answer.headers.get("X-Message-Id") or None

    def classify(self, answer: ApiAnswer) -> ProviderError:
        # SendGrid's errors name a field, not a code; the field says what to fix.
        field = None
        errors = answer.body.get("errors") if isinstance(answer.body, dict) else None
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            field = _token(errors[0].get("field"))
        reset = seconds_until(answer.headers.get("X-RateLimit-Reset"))
        return status_error(
            self.name,
            answer,
            retry_after=reset if answer.status == 429 else None,
            note=f"field {field}" if field else None,
        )


def sendgrid_provider_from_url(url: str, timeout: float) -> SendGridProvider:
    """`sendgrid://` (global) or `sendgrid://eu` (EU data residency)."""
    parsed = parse_provider_url(url)
    region = (parsed.host or "").lower()
    if region not in BASES or parsed.port or parsed.path not in ("", "/"):
        raise ConfigurationError(
            "sendgrid:// provider URL is sendgrid://?from=... or sendgrid://eu?from=... "
            "(the EU region); nothing else goes before the options"
        )
    return SendGridProvider(
        settings_for(
            parsed, base=BASES[region], path="/v3/mail/send", variables=VARIABLES, timeout=timeout
        )
    )
