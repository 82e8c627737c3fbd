"""Delivering through a JSON mail API over HTTP(S), with the delivery key as idempotency key.

Most mail APIs deduplicate on an `Idempotency-Key` header, which turns the outbox's stable
delivery key into end-to-end duplicate suppression: a send repeated after a lost lease reaches
the API with the same key and is dropped there. Status codes map onto the worker's outcomes:
2xx accepted; 408, 429, 5xx, 3xx, timeouts and connection errors transient; any other 4xx
permanent, except 401 and 403: a revoked or rotated API credential says nothing about the
message, so those retry (and page through the retry alert) instead of dead-lettering the
whole queue. Response bodies are never quoted in errors, because APIs echo the request (and so
the code) back in validation errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import aiohttp

from leasebox.delivery.providers.base import (
    Email,
    SendResult,
)
from leasebox.delivery.providers.urls import ProviderUrl, parse_provider_url
from leasebox.errors import (
    ConfigurationError,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from leasebox.version import __version__

URL_OPTIONS = ("from", "timeout", "tls_verify", "token_env")
TRANSIENT_STATUSES = frozenset({401, 403, 408, 429})
MESSAGE_ID_HEADER = "X-Message-Id"


@dataclass(frozen=True)
class HttpSettings:
    """The endpoint to POST to (no credentials in it) and how to authenticate."""

    endpoint: str
    token: str | None = field(default=None, repr=False)
    sender: str | None = None
    tls_verify: bool = True
    timeout: float = 10.0

    @property
    def target(self) -> str:
        """The endpoint without its query string, which may carry an API key."""
        parts = urlsplit(self.endpoint)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def request_body(email: Email, sender: str | None = None) -> dict[str, Any]:
    """The JSON document the API receives for `email`."""
    body: dict[str, Any] = {
        "to": email.recipient,
        "subject": email.subject,
        "text": email.text,
        "html": email.html,
        "delivery_key": email.delivery_key,
        "kind": email.kind,
        "metadata": {"outbox_id": email.outbox_id, "aggregate_id": email.aggregate_id},
    }
    if sender is not None:
        body["from"] = sender
    return body


def message_id_from(payload: object, headers: Any) -> str | None:
    """The API's id for an accepted message: JSON `id`, `message_id`, or `X-Message-Id`."""
    if isinstance(payload, dict):
        for key in ("id", "message_id"):
            value = payload.get(key)
            if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
                return str(value)
    header = headers.get(MESSAGE_ID_HEADER)
    return str(header) if header else None


def status_error(status: int, reason: str | None, target: str) -> ProviderError:
    """The error for a non-2xx status, classified for the worker."""
    message = f"HTTP {status} {reason or ''}".rstrip() + f" from {target}"
    if status in TRANSIENT_STATUSES or status >= 500 or 300 <= status < 400:
        return TransientProviderError(f"http_{status}", message)
    return PermanentProviderError(f"http_{status}", message)


class HttpProvider:
    """POSTs each email as JSON; one `aiohttp` session serves all concurrent sends."""

    name = "http"

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"HttpProvider({self.settings.target})"

    async def start(self) -> None:
        if self._session is not None and not self._session.closed:
            return
        headers = {"User-Agent": f"leasebox/{__version__}", "Accept": "application/json"}
        if self.settings.token:
            headers["Authorization"] = f"Bearer {self.settings.token}"
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.settings.timeout),
            connector=aiohttp.TCPConnector(ssl=self.settings.tls_verify),
        )

    async def send(self, email: Email) -> SendResult:
        if self._session is None or self._session.closed:
            await self.start()
        assert self._session is not None
        target = self.settings.target
        try:
            async with self._session.post(
                self.settings.endpoint,
                json=request_body(email, self.settings.sender),
                headers={"Idempotency-Key": email.delivery_key},
                allow_redirects=False,
            ) as response:
                if not 200 <= response.status < 300:
                    raise status_error(response.status, response.reason, target)
                try:
                    payload: object = await response.json(content_type=None)
                except ValueError:
                    payload = None
                return SendResult(provider_message_id=message_id_from(payload, response.headers))
        except TimeoutError:
            raise TransientProviderError(
                "timeout", f"{target} did not answer within {self.settings.timeout:g}s"
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise TransientProviderError(
                "tls", f"TLS with {target} failed: {type(exc).__name__}"
            ) from None
        except aiohttp.ClientError as exc:
            raise TransientProviderError(
                "connection", f"cannot reach {target}: {_describe_client_error(exc)}"
            ) from None

    async def check(self) -> str | None:
        if self._session is None or self._session.closed:
            return "the HTTP provider is not started"
        return None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _describe_client_error(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.os_error.strerror or type(exc.os_error).__name__
    # Other client errors quote the URL, query string and all.
    return type(exc).__name__


def settings_from_url(parsed: ProviderUrl, url: str, timeout: float) -> HttpSettings:
    """HttpSettings from a parsed `http(s)://` URL; unknown query options go to the API."""
    scheme = parsed.scheme
    if not parsed.host:
        raise ConfigurationError(f"{scheme}:// provider URL needs a host")
    if parsed.username and parsed.password is None:
        raise ConfigurationError(
            f"{scheme}:// provider URL has a user name but no token; put the token in the "
            f"password part ({scheme}://:TOKEN@host/path) or use ?token_env=NAME"
        )
    token = parsed.password or None
    token_env = parsed.options.get("token_env")
    if token_env is not None:
        if token:
            raise ConfigurationError(
                f"{scheme}:// provider URL gives a token twice: in the URL and with token_env"
            )
        token = os.environ.get(token_env, "").strip()
        if not token:
            named = repr(token_env) if token_env.isidentifier() else "an environment variable"
            raise ConfigurationError(
                f"{scheme}:// provider URL option token_env names {named}, which is not set "
                "or empty"
            )
    parts = urlsplit(url.strip())
    netloc = parsed.host if ":" not in parsed.host else f"[{parsed.host}]"
    if parsed.port is not None:
        netloc = f"{netloc}:{parsed.port}"
    passthrough = {k: v for k, v in parsed.options.items() if k not in URL_OPTIONS}
    endpoint = urlunsplit((scheme, netloc, parts.path or "/", urlencode(passthrough), ""))
    return HttpSettings(
        endpoint=endpoint,
        token=token,
        sender=parsed.options.get("from") or None,
        tls_verify=parsed.bool_option("tls_verify", True),
        timeout=parsed.float_option("timeout", timeout),
    )


def http_provider_from_url(url: str, timeout: float) -> HttpProvider:
    """The `http://` / `https://` factory used by `provider_from_url`."""
    return HttpProvider(settings_from_url(parse_provider_url(url), url, timeout))
