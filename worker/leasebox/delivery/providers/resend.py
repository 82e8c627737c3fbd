"""Resend (`resend://`): the Emails API, with the delivery key as its idempotency key.

POST `/emails` with a bearer key and `Idempotency-Key: <delivery key>`; 200 with `{"id"}`.
Resend keeps a key for 24 hours and answers a repeated request with the first answer
without sending again, so a send repeated after a lost lease reaches the inbox once.

Errors are `{"statusCode", "name", "message"}`, and `name` says why: `validation_error`,
`invalid_parameter`, `missing_required_field`, `invalid_attachment` (400/422) reject the
message; `missing_api_key`, `invalid_api_key`, `restricted_api_key`, `invalid_from_address`
(a sender whose domain is not verified) and 403 `validation_error` (a test key sending to
someone else) are the account's problem (401/403, retried and alerted on);
`rate_limit_exceeded`, `daily_quota_exceeded` and `monthly_quota_exceeded` are 429 with
`retry-after`; `concurrent_idempotent_requests` (409) means another worker is sending the
same message right now: retried, and the retry gets the first send's answer;
`invalid_idempotent_request` (409) means this key was used for a different request in the
last 24 hours, so Resend already sent something under it: dead-lettered for a person to look
at, never sent a second time blindly. 5xx (`application_error`, `internal_server_error`) are
Resend's trouble.
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
from leasebox.delivery.providers.urls import parse_provider_url
from leasebox.errors import ConfigurationError, ProviderError

VARIABLES = ("RESEND_API_KEY",)
BASE = "https://api.resend.com"
IDEMPOTENCY_WINDOW_HOURS = 24
NAMES = frozenset(
    {
        "validation_error",
        "invalid_parameter",
        "missing_required_field",
        "invalid_attachment",
        "invalid_idempotency_key",
        "invalid_idempotent_request",
        "concurrent_idempotent_requests",
        "missing_api_key",
        "invalid_api_key",
        "restricted_api_key",
        "invalid_from_address",
        "invalid_access",
        "invalid_region",
        "not_found",
        "method_not_allowed",
        "rate_limit_exceeded",
        "daily_quota_exceeded",
        "monthly_quota_exceeded",
        "security_error",
        "application_error",
        "internal_server_error",
    }
)
ACCOUNT = frozenset(
    {"missing_api_key", "invalid_api_key", "restricted_api_key", "invalid_from_address"}
)


class ResendProvider(MailApiProvider):
    name = "resend"
    idempotent = True

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.token}"}

    def build(self, email: Email) -> ApiRequest:
        # Nothing in the body may change between attempts (no attempt number, no time):
        # Resend compares a repeated request with the first one under the same key.
        body: dict[str, Any] = {
            "from": self.settings.sender,
            "to": [email.recipient],
            "subject": email.subject,
            "text": email.text,
            "headers": {KEY_HEADER: key_digest(email.delivery_key)},
            "tags": [
                {"name": "leasebox_kind", "value": email.kind},
                {"name": "leasebox_outbox_id", "value": str(email.outbox_id)},
            ],
        }
        if email.html:
            body["html"] = email.html
        return ApiRequest(json=body, headers={"Idempotency-Key": email.delivery_key})

    def message_id(self, answer: ApiAnswer) -> str | None:
        found = answer.body.get("id") if isinstance(answer.body, dict) else None
        return found if isinstance(found, str) and found else None

    def classify(self, answer: ApiAnswer) -> ProviderError:
        raw = answer.body.get("name") if isinstance(answer.body, dict) else None
        name = raw if raw in NAMES else None
        if name == "concurrent_idempotent_requests":
            return status_error(
                self.name, answer, code=name, permanent=False, outcome=RequestOutcome.ERROR
            )
        if name == "invalid_idempotent_request":
            return status_error(
                self.name,
                answer,
                code=name,
                permanent=True,
                outcome=RequestOutcome.REJECTED,
                note="Resend already took a different request under this delivery key",
            )
        if name in ACCOUNT or answer.status in (401, 403):
            return status_error(
                self.name, answer, code=name, permanent=False, outcome=RequestOutcome.ACCOUNT
            )
        return status_error(self.name, answer, code=name)


def resend_provider_from_url(url: str, timeout: float) -> ResendProvider:
    """`resend://?from=...`."""
    parsed = parse_provider_url(url)
    if parsed.host or parsed.port or parsed.path not in ("", "/"):
        raise ConfigurationError("resend:// provider URL takes no host or path: resend://?from=...")
    return ResendProvider(
        settings_for(parsed, base=BASE, path="/emails", variables=VARIABLES, timeout=timeout)
    )
