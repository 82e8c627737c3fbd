"""What the HTTP mail services (SendGrid, Postmark, Mailgun, Resend) share: one base provider.

Each service differs in four things only, which its module supplies: the request it wants
(`build`), where the message id is in the answer (`message_id`), what its error statuses and
bodies mean (`classify`), and how it authenticates (`auth_headers`). Everything else is the
same and lives here: one `aiohttp` session per worker, a bounded read of the answer, the
mapping of timeouts and connection errors, the API key read from the URL, a named
environment variable, a file (a mounted Secret) or the service's usual variable, and an
endpoint override for a proxy or a local stand-in.

Errors never quote a response body: services echo the request back (recipient, code) in
their messages. What an error keeps is the status and the service's own error *code*, and
only when that code is a short token (`_token`), so a hostile or broken server cannot smuggle
text into logs or `last_error`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parseaddr
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from leasebox.config import PROVIDER_TIMEOUT
from leasebox.delivery.providers.base import (
    Email,
    RequestOutcome,
    SendResult,
    parse_retry_after,
)
from leasebox.delivery.providers.urls import TIMEOUT, ProviderUrl, UrlOption, option_names
from leasebox.errors import (
    ConfigurationError,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from leasebox.version import __version__

FROM = UrlOption(
    "from", "required", "a sender the service has verified, `address` or `Name <address>`"
)
ENDPOINT = UrlOption(
    "endpoint",
    "the service's API",
    "another API root, for a proxy or a stand-in: `https://`, or `http://` to loopback only",
)
COMMON_OPTIONS = (
    FROM,
    TIMEOUT,
    ENDPOINT,
    UrlOption(
        "token_env",
        "the service's variable",
        "read the API key from this environment variable (else the URL's password, else the "
        "service's usual variable)",
    ),
    UrlOption("token_file", "none", "read the API key from this file, e.g. a mounted Secret"),
)
# The most of an answer that is read: success bodies are a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024
# A header that identifies the logical send without showing the delivery key (which may name
# the aggregate) to the recipient: the same digest as SMTP's derived Message-ID.
KEY_HEADER = "X-Leasebox-Key"
_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def _token(value: object) -> str | None:
    """`value` if it is a short code such as `validation_error` or `406`, else None."""
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    return text if _TOKEN.fullmatch(text) else None


@dataclass(frozen=True)
class ApiSettings:
    """One service's endpoint, sender and credentials; the key never shows in a repr."""

    endpoint: str
    sender: str
    token: str = field(repr=False)
    timeout: float = PROVIDER_TIMEOUT.default
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ApiRequest:
    """What one send POSTs: a JSON document or a form, and extra headers."""

    json: Any = None
    form: list[tuple[str, str]] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ApiAnswer:
    """A response: status, headers and the JSON body (None when absent or not JSON)."""

    status: int
    headers: Mapping[str, str]
    body: Any


def read_token(parsed: ProviderUrl, variables: tuple[str, ...], environ: Mapping[str, str]) -> str:
    """The API key: URL password, `token_env=NAME`, `token_file=PATH`, or a usual variable."""
    scheme = parsed.scheme
    given = [
        name
        for name, present in (
            ("the URL", parsed.password is not None),
            ("token_env", "token_env" in parsed.options),
            ("token_file", "token_file" in parsed.options),
        )
        if present
    ]
    if len(given) > 1:
        raise ConfigurationError(
            f"{scheme}:// provider URL gives the API key twice: {' and '.join(given)}"
        )
    if parsed.password is not None:
        token = parsed.password.strip()
    elif "token_env" in parsed.options:
        name = parsed.options["token_env"]
        token = environ.get(name, "").strip()
        if not token:
            named = repr(name) if name.isidentifier() else "an environment variable"
            raise ConfigurationError(
                f"{scheme}:// provider URL option token_env names {named}, which is not set"
            )
    elif "token_file" in parsed.options:
        token = _read_file(scheme, parsed.options["token_file"])
    else:
        token = next((environ[v].strip() for v in variables if environ.get(v, "").strip()), "")
        if not token:
            raise ConfigurationError(
                f"{scheme}:// needs an API key: set {' or '.join(variables)}, or give "
                "?token_env=NAME or ?token_file=PATH (a mounted Secret)"
            )
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigurationError(f"{scheme}:// API key is empty or holds whitespace")
    return token


def _read_file(scheme: str, path: str) -> str:
    try:
        return Path(path).read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(
            f"{scheme}:// provider URL option token_file cannot be read "
            f"({type(exc).__name__}: {exc.strerror if isinstance(exc, OSError) else 'not text'})"
        ) from None


def read_sender(parsed: ProviderUrl) -> str:
    """The `from` option: required, an address with an optional display name."""
    sender = parsed.options.get("from", "").strip()
    _, address = parseaddr(sender)
    if not sender or "@" not in address:
        raise ConfigurationError(
            f"{parsed.scheme}:// provider URL needs ?from=ADDRESS, a sender the service has "
            "verified, e.g. from=no-reply%40example.com"
        )
    return sender


def read_endpoint(parsed: ProviderUrl, default: str) -> str:
    """`default`, or the `endpoint` option (https, or plain http to a loopback stand-in)."""
    raw = parsed.options.get("endpoint")
    if raw is None:
        return default
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{parsed.scheme}:// provider URL option endpoint must be an https:// URL"
        )
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ConfigurationError(
            f"{parsed.scheme}:// provider URL option endpoint must use https (plain http only "
            "to a loopback address): the API key would travel in clear text"
        )
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def seconds_until(epoch: str | None, now: datetime | None = None) -> float | None:
    """Seconds until a Unix timestamp header (SendGrid's `X-RateLimit-Reset`), if ahead."""
    if epoch is None or not epoch.strip().isdigit():
        return None
    delta = int(epoch.strip()) - (now or datetime.now(UTC)).timestamp()
    return delta if delta > 0 else None


def status_error(
    service: str,
    answer: ApiAnswer,
    *,
    code: str | None = None,
    permanent: bool | None = None,
    outcome: RequestOutcome | None = None,
    retry_after: float | None = None,
    note: str | None = None,
) -> ProviderError:
    """The error for a refused request: `<service>_<code or status>`, classified.

    Unless told otherwise: 429 is throttling, 401/403 a problem with the account (transient:
    a rotated key says nothing about the message), 408 and 5xx transient, any other 4xx a
    permanent rejection of the message. The message is one line without the body.
    """
    status = answer.status
    if outcome is None:
        if status == 429:
            outcome = RequestOutcome.THROTTLED
        elif status in (401, 403):
            outcome = RequestOutcome.ACCOUNT
        elif status >= 500:
            outcome = RequestOutcome.UNAVAILABLE
        elif status == 408:
            outcome = RequestOutcome.TIMEOUT
        else:
            outcome = RequestOutcome.REJECTED
    if permanent is None:
        permanent = outcome is RequestOutcome.REJECTED
    label = f"{service}_{code or status}"
    detail = f"{service} answered HTTP {status}" + (f" ({code})" if code else "")
    if note:
        detail += f" ({note})"
    header = parse_retry_after(answer.headers.get("Retry-After"))
    retry_after = header if header is not None else retry_after
    kind = PermanentProviderError if permanent else TransientProviderError
    return kind(label, detail, retry_after=retry_after, outcome=outcome.value)


class MailApiProvider:
    """The shared half of an HTTP mail service; a subclass says what differs."""

    name: str
    idempotent: bool = False

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings.endpoint})"

    # -- what a service supplies ---------------------------------------------------------------

    def auth_headers(self) -> dict[str, str]:
        raise NotImplementedError

    def build(self, email: Email) -> ApiRequest:
        raise NotImplementedError

    def message_id(self, answer: ApiAnswer) -> str | None:
        raise NotImplementedError

    def classify(self, answer: ApiAnswer) -> ProviderError:
        return status_error(self.name, answer)

    def accepted(self, answer: ApiAnswer) -> bool:
        return 200 <= answer.status < 300

    # -- shared --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._open_session()

    def _open_session(self) -> aiohttp.ClientSession:
        """The provider's HTTP session, opened on first use or again after a close."""
        if self._session is not None and not self._session.closed:
            return self._session
        self._session = aiohttp.ClientSession(
            headers={
                "User-Agent": f"leasebox/{__version__}",
                "Accept": "application/json",
                **self.auth_headers(),
            },
            timeout=aiohttp.ClientTimeout(total=self.settings.timeout),
        )
        return self._session

    async def send(self, email: Email) -> SendResult:
        session = self._open_session()
        request = self.build(email)
        target = self.settings.endpoint
        try:
            async with session.post(
                target,
                json=request.json if request.form is None else None,
                data=aiohttp.FormData(request.form) if request.form is not None else None,
                headers=dict(request.headers),
                allow_redirects=False,
            ) as response:
                raw = await response.content.read(MAX_BODY_BYTES)
                answer = ApiAnswer(response.status, response.headers, _json(raw))
        except TimeoutError:
            raise TransientProviderError(
                "timeout",
                f"{self.name} did not answer within {self.settings.timeout:g}s",
                outcome=RequestOutcome.TIMEOUT.value,
            ) from None
        except aiohttp.ClientError as exc:
            reason = (
                exc.os_error.strerror or type(exc.os_error).__name__
                if isinstance(exc, aiohttp.ClientConnectorError)
                else type(exc).__name__
            )
            raise TransientProviderError(
                "connection",
                f"cannot reach {self.name} at {_host(target)}: {reason}",
                outcome=RequestOutcome.CONNECTION.value,
            ) from None
        if not self.accepted(answer):
            raise self.classify(answer)
        return SendResult(provider_message_id=self.message_id(answer))

    async def check(self) -> str | None:
        if self._session is None or self._session.closed:
            return f"the {self.name} provider is not started"
        return None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _host(url: str) -> str:
    return urlsplit(url).netloc


def settings_for(
    parsed: ProviderUrl,
    *,
    base: str,
    path: str,
    variables: tuple[str, ...],
    timeout: float,
    options: tuple[UrlOption, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> ApiSettings:
    """ApiSettings from a parsed service URL: options checked, key and sender read.

    `base` is the service's API root (the `endpoint` option replaces it), `path` what a send
    POSTs to beneath it.
    """
    parsed.reject_unknown_options(option_names((*COMMON_OPTIONS, *options)))
    if parsed.username:
        raise ConfigurationError(
            f"{parsed.scheme}:// provider URL takes no user name; put the API key in "
            f"{variables[0]} or use ?token_env=NAME"
        )
    env = os.environ if environ is None else environ
    return ApiSettings(
        endpoint=read_endpoint(parsed, base) + path,
        sender=read_sender(parsed),
        token=read_token(parsed, variables, env),
        timeout=parsed.float_option("timeout", timeout),
        options={k: v for k, v in parsed.options.items() if k in option_names(options)},
    )
