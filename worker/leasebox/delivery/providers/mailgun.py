"""Mailgun (`mailgun://us/DOMAIN`, `mailgun://eu/DOMAIN`): the Messages API.

POST a form to `/v3/DOMAIN/messages` with HTTP Basic auth `api:KEY`; 200 with
`{"id": "<...@DOMAIN>", "message": "Queued. Thank you."}`. Errors are `{"message": ...}`:
400 a message Mailgun refuses (a malformed address, no body), 401 or 403 a bad key, 404 a
domain it does not know (eventually consistent: a domain just added may 404 for a while, so
it is retried as the account's problem), 413 too large, 429 throttling, 5xx its trouble.

Mailgun has no idempotency key: a send repeated after a lost lease is a second email. The
delivery key travels as the user variable `v:leasebox-delivery-key` (in its events and
webhooks, for finding the duplicate) and its digest as the `X-Leasebox-Key` header.
Suppressed addresses are accepted and dropped later (events show them), not refused here.
"""

from __future__ import annotations

import base64
import re

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

VARIABLES = ("MAILGUN_API_KEY",)
BASES = {"us": "https://api.mailgun.net", "eu": "https://api.eu.mailgun.net"}
_DOMAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9-]{1,63})+$")


class MailgunProvider(MailApiProvider):
    name = "mailgun"
    idempotent = False

    def auth_headers(self) -> dict[str, str]:
        pair = base64.b64encode(f"api:{self.settings.token}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}

    def build(self, email: Email) -> ApiRequest:
        form = [
            ("from", self.settings.sender),
            ("to", email.recipient),
            ("subject", email.subject),
            ("text", email.text),
        ]
        if email.html:
            form.append(("html", email.html))
        form += [
            ("o:tag", email.kind),
            (f"h:{KEY_HEADER}", key_digest(email.delivery_key)),
            ("v:leasebox-delivery-key", email.delivery_key),
            ("v:leasebox-outbox-id", str(email.outbox_id)),
        ]
        return ApiRequest(form=form)

    def message_id(self, answer: ApiAnswer) -> str | None:
        found = answer.body.get("id") if isinstance(answer.body, dict) else None
        return found if isinstance(found, str) and found else None

    def classify(self, answer: ApiAnswer) -> ProviderError:
        if answer.status == 404:
            return status_error(self.name, answer, permanent=False, outcome=RequestOutcome.ACCOUNT)
        return status_error(self.name, answer)


def mailgun_provider_from_url(url: str, timeout: float) -> MailgunProvider:
    """`mailgun://REGION/DOMAIN?from=...`, REGION `us` or `eu`."""
    parsed = parse_provider_url(url)
    region = (parsed.host or "").lower()
    domain = parsed.path.strip("/")
    if region not in BASES or parsed.port or not _DOMAIN.fullmatch(domain):
        raise ConfigurationError(
            "mailgun:// provider URL is mailgun://us/DOMAIN?from=... or "
            "mailgun://eu/DOMAIN?from=..., DOMAIN being your Mailgun sending domain"
        )
    return MailgunProvider(
        settings_for(
            parsed,
            base=BASES[region],
            path=f"/v3/{domain}/messages",
            variables=VARIABLES,
            timeout=timeout,
        )
    )
