"""Delivering through a JSON mail API over HTTP(S), with the delivery key as idempotency key.

Most mail APIs deduplicate on an `Idempotency-Key` header, which turns the outbox's stable
delivery key into end-to-end duplicate suppression: a send repeated after a lost lease reaches
the API with the same key and is dropped there. Status codes map onto the worker's outcomes:
2xx accepted; 408, 429, 5xx, 3xx, timeouts and connection errors transient; any other 4xx
permanent, except 401 and 403: a revoked or rotated API credential says nothing about the
message, so those retry (and page through the retry alert) instead of dead-lettering the
whole queue. Response bodies are never quoted in errors, because APIs echo the request (and so
the code) back in validation errors.

The status decides: a 2xx is an acceptance even when its body is cut off, stalls or is not
JSON (the message is `sent` with no provider id and a warning; retrying it would send it
again), and the body is read only up to `MAX_REPLY_BYTES`. A 429 or 503 with `Retry-After`
makes the next attempt wait at least that long. A connection the API drops after the request
went out is ambiguous (it may have accepted it); the retry carries the same Idempotency-Key.

Waits are bounded and checked: at most `MAX_CONNECTIONS` requests are in flight, a request
waits for a slot no longer than the timeout, and the message's expiry (and, for a message
with a replacement key, whether a newer one replaced it) is checked after that wait, right
before the request is written. Readiness (`check`) is a TCP (and TLS) connect to
the endpoint, cached for `check_interval` seconds so that probes cost the API nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import aiohttp

from leasebox.config import PROVIDER_TIMEOUT
from leasebox.delivery.providers.base import (
    Email,
    SendResult,
    acquire_slot,
    parse_retry_after,
)
from leasebox.delivery.providers.urls import (
    TIMEOUT,
    ProviderUrl,
    UrlOption,
    option_names,
    parse_provider_url,
)
from leasebox.errors import (
    AmbiguousProviderError,
    ConfigurationError,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from leasebox.version import __version__

URL_OPTIONS = (
    UrlOption("from", "none", "a sender, sent as the JSON body's `from`; left out when unset"),
    UrlOption(
        "tls_verify", "`true`", "check the server's certificate and name; `false` for tests only"
    ),
    TIMEOUT,
    UrlOption(
        "token_env",
        "none",
        "read the bearer token from this environment variable (else the URL's password); "
        "every other option is passed on to the API in the query string",
    ),
)
_OWN_OPTIONS = frozenset(option_names(URL_OPTIONS))
TRANSIENT_STATUSES = frozenset({401, 403, 408, 429})
RETRY_AFTER_STATUSES = frozenset({429, 503})
MESSAGE_ID_HEADER = "X-Message-Id"
# A reply carrying a message id is small; anything longer is not read further.
MAX_REPLY_BYTES = 64 * 1024
MAX_CONNECTIONS = 100
CHECK_INTERVAL = 10.0
CHECK_TIMEOUT = 3.0


@dataclass(frozen=True)
class HttpSettings:
    """The endpoint to POST to (no credentials in it) and how to authenticate."""

    endpoint: str
    token: str | None = field(default=None, repr=False)
    sender: str | None = None
    tls_verify: bool = True
    timeout: float = PROVIDER_TIMEOUT.default

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
        "metadata": {
            "outbox_id": email.outbox_id,
            "aggregate_id": email.aggregate_id,
            "attempt": email.attempt,
        },
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


def status_error(
    status: int, reason: str | None, target: str, retry_after: float | None = None
) -> ProviderError:
    """The error for a non-2xx status, classified for the worker."""
    message = f"HTTP {status} {reason or ''}".rstrip() + f" from {target}"
    if retry_after is not None:
        message += f", retry after {retry_after:g}s"
    if status in TRANSIENT_STATUSES or status >= 500 or 300 <= status < 400:
        return TransientProviderError(f"http_{status}", message, retry_after=retry_after)
    return PermanentProviderError(f"http_{status}", message)


class HttpProvider:
    """POSTs each email as JSON; one `aiohttp` session serves all concurrent sends."""

    name = "http"

    def __init__(
        self,
        settings: HttpSettings,
        *,
        check_interval: float = CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.check_interval = check_interval
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._checked: tuple[float, str | None] | None = None
        self._check_lock = asyncio.Lock()

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
            connector=aiohttp.TCPConnector(ssl=self.settings.tls_verify, limit=MAX_CONNECTIONS),
        )

    async def send(self, email: Email) -> SendResult:
        if self._session is None or self._session.closed:
            await self.start()
        session = self._session
        if session is None:  # start() always opens one; this keeps the type checker honest
            raise TransientProviderError("closed", "the HTTP provider is closed")
        target = self.settings.target
        await acquire_slot(self._slots, self.settings.timeout, self.settings.target)
        try:
            await email.raise_if_stale()
            async with session.post(
                self.settings.endpoint,
                json=request_body(email, self.settings.sender),
                headers={"Idempotency-Key": email.delivery_key},
                allow_redirects=False,
            ) as response:
                if not 200 <= response.status < 300:
                    retry_after = None
                    if response.status in RETRY_AFTER_STATUSES:
                        retry_after = parse_retry_after(response.headers.get("Retry-After"))
                        retry_after = retry_after if retry_after and retry_after > 0 else None
                    raise status_error(response.status, response.reason, target, retry_after)
                return await _accepted(response)
        except TimeoutError:
            raise TransientProviderError(
                "timeout", f"{target} did not answer within {self.settings.timeout:g}s"
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise TransientProviderError(
                "tls", f"TLS with {target} failed: {type(exc).__name__}"
            ) from None
        except aiohttp.ServerDisconnectedError:
            raise AmbiguousProviderError(
                f"{target} closed the connection before answering; it may have accepted the "
                "message (retried later with the same Idempotency-Key)"
            ) from None
        except aiohttp.ClientError as exc:
            raise TransientProviderError(
                "connection", f"cannot reach {target}: {_describe_client_error(exc)}"
            ) from None
        finally:
            self._slots.release()

    async def check(self) -> str | None:
        """None when the endpoint accepts connections, else why not (cached a while)."""
        if self._session is None or self._session.closed:
            return "the HTTP provider is not started"
        async with self._check_lock:
            now = self._clock()
            if self._checked is not None and now - self._checked[0] < self.check_interval:
                return self._checked[1]
            problem = await self._probe()
            self._checked = (self._clock(), problem)
            return problem

    async def _probe(self) -> str | None:
        parts = urlsplit(self.settings.endpoint)
        secure = parts.scheme == "https"
        context: ssl.SSLContext | None = None
        if secure:
            context = ssl.create_default_context()
            if not self.settings.tls_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        host, port = parts.hostname or "", parts.port or (443 if secure else 80)
        try:
            async with asyncio.timeout(min(CHECK_TIMEOUT, self.settings.timeout)):
                _, writer = await asyncio.open_connection(host, port, ssl=context)
                writer.close()
                await writer.wait_closed()
        except TimeoutError:
            return f"{self.settings.target} did not accept a connection in time"
        except ssl.SSLError as exc:
            return f"TLS with {self.settings.target} failed: {exc.reason or type(exc).__name__}"
        except OSError as exc:
            return f"cannot reach {self.settings.target}: {exc.strerror or type(exc).__name__}"
        return None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


async def _accepted(response: aiohttp.ClientResponse) -> SendResult:
    """The acceptance a 2xx stands for, with the API's id if its reply can be read."""
    header_id = response.headers.get(MESSAGE_ID_HEADER)
    try:
        body = await _read_bounded(response)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return SendResult(
            provider_message_id=header_id or None,
            warning=f"HTTP {response.status}, but the reply could not be read "
            f"({type(exc).__name__}): no provider id",
        )
    if body is None:
        return SendResult(
            provider_message_id=header_id or None,
            warning=f"HTTP {response.status} with a reply over {MAX_REPLY_BYTES} bytes, not "
            "read: no provider id",
        )
    try:
        payload: object = json.loads(body)
    except ValueError:  # not JSON (UnicodeDecodeError is one): an id may be in the header
        payload = None
    return SendResult(provider_message_id=message_id_from(payload, response.headers))


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes | None:
    """The body, or None if it is longer than `MAX_REPLY_BYTES`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await response.content.read(MAX_REPLY_BYTES + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            return None


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
    passthrough = {k: v for k, v in parsed.options.items() if k not in _OWN_OPTIONS}
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
