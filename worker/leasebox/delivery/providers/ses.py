"""Amazon SES (`ses://REGION`): SendEmail of the SES v2 API, signed by the AWS SDK.

Requests are built, signed (SigV4) and sent by `aiobotocore`, the asyncio flavour of the
AWS SDK's core, so leasebox never signs anything itself. Credentials come from the SDK's
own chain: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (a Secret mapped into the pod's
environment), a shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, a mounted Secret),
IAM roles for service accounts (web identity), or the instance or task role. The SDK's own
retries are off: the outbox retries, with its backoff and attempt limit, and counts them.

Errors, by the code SES returns: `MessageRejected` (an unverified recipient in the sandbox,
a virus) and `BadRequestException` reject the message; `TooManyRequestsException` (429) and
`LimitExceededException` (the sending quota) are throttling; `AccountSuspendedException`,
`SendingPausedException`, `MailFromDomainNotVerifiedException`, `NotFoundException` (a
configuration set that does not exist) and the SDK's credential errors are the account's
problem, retried and alerted on rather than dead-lettering every message; 5xx are SES's.
A recipient on the account's suppression list is accepted and dropped by SES later (its
events say so), not refused here.

SES has no idempotency key: a send repeated after a lost lease is a second email. The
delivery key's digest travels as the `X-Leasebox-Key` header and as an email tag
(`leasebox_key`, in SES's event publishing), beside `leasebox_kind` and `leasebox_outbox_id`.
"""

from __future__ import annotations

import re
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from leasebox.config import PROVIDER_TIMEOUT
from leasebox.delivery.providers.base import (
    Email,
    RequestOutcome,
    SendResult,
    key_digest,
    parse_retry_after,
)
from leasebox.delivery.providers.mail_api import (
    ENDPOINT,
    FROM,
    KEY_HEADER,
    read_endpoint,
    read_sender,
)
from leasebox.delivery.providers.urls import TIMEOUT, UrlOption, option_names, parse_provider_url
from leasebox.errors import (
    ConfigurationError,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)

URL_OPTIONS = (
    FROM,
    TIMEOUT,
    ENDPOINT,
    UrlOption("configuration_set", "none", "the SES configuration set to send with"),
)
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
REJECTING = frozenset({"MessageRejected", "BadRequestException"})
THROTTLING = frozenset(
    {"TooManyRequestsException", "LimitExceededException", "Throttling", "ThrottlingException"}
)
ACCOUNT = frozenset(
    {
        "AccountSuspendedException",
        "SendingPausedException",
        "MailFromDomainNotVerifiedException",
        "NotFoundException",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "InvalidSignatureException",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "ExpiredTokenException",
    }
)
KNOWN = REJECTING | THROTTLING | ACCOUNT | {"InternalFailure", "ServiceUnavailable"}


@dataclass(frozen=True)
class SesSettings:
    region: str
    sender: str
    endpoint: str | None = None
    configuration_set: str | None = None
    timeout: float = PROVIDER_TIMEOUT.default


def _snake(code: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", code.removesuffix("Exception")).lower()


def client_error(exc: Any) -> ProviderError:
    """The error for a `botocore` ClientError: classified by SES's code, without its text."""
    response = getattr(exc, "response", {}) or {}
    code = str(response.get("Error", {}).get("Code") or "")
    meta = response.get("ResponseMetadata", {}) or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    headers = meta.get("HTTPHeaders", {}) or {}
    retry_after = parse_retry_after(headers.get("retry-after"))
    known = code if code in KNOWN else None
    label = f"ses_{_snake(known)}" if known else f"ses_{status or 'error'}"
    detail = f"SES answered HTTP {status}" + (f" ({known})" if known else "")
    if known in REJECTING:
        return PermanentProviderError(label, detail, outcome=RequestOutcome.REJECTED.value)
    if known in THROTTLING or status == 429:
        return TransientProviderError(
            label, detail, retry_after=retry_after, outcome=RequestOutcome.THROTTLED.value
        )
    if known in ACCOUNT or status in (401, 403):
        return TransientProviderError(label, detail, outcome=RequestOutcome.ACCOUNT.value)
    if status >= 500 or status == 0:
        return TransientProviderError(
            label, detail, retry_after=retry_after, outcome=RequestOutcome.UNAVAILABLE.value
        )
    return PermanentProviderError(label, detail, outcome=RequestOutcome.REJECTED.value)


def sdk_error(exc: BaseException, region: str) -> ProviderError:
    """The error for anything else the SDK raises: timeouts, connections, credentials."""
    from botocore import exceptions as boto

    if isinstance(exc, boto.ClientError):
        return client_error(exc)
    if isinstance(exc, boto.ConnectTimeoutError | boto.ReadTimeoutError | TimeoutError):
        return TransientProviderError(
            "timeout",
            f"SES in {region} did not answer in time",
            outcome=RequestOutcome.TIMEOUT.value,
        )
    if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
        return TransientProviderError(
            "ses_credentials",
            "no AWS credentials found (environment, shared file, web identity or role)",
            outcome=RequestOutcome.ACCOUNT.value,
        )
    if isinstance(exc, boto.CredentialRetrievalError):
        return TransientProviderError(
            "ses_credentials",
            "AWS credentials could not be fetched",
            outcome=RequestOutcome.ACCOUNT.value,
        )
    if isinstance(exc, boto.EndpointConnectionError | boto.ConnectionClosedError | OSError):
        return TransientProviderError(
            "connection", f"cannot reach SES in {region}", outcome=RequestOutcome.CONNECTION.value
        )
    return TransientProviderError(
        "ses_sdk", f"the AWS SDK failed: {type(exc).__name__}", outcome=RequestOutcome.ERROR.value
    )


class SesProvider:
    """SES v2 SendEmail through one aiobotocore client per worker."""

    name = "ses"
    idempotent = False

    def __init__(self, settings: SesSettings) -> None:
        self.settings = settings
        self._stack: AsyncExitStack | None = None
        self._client: Any = None

    def __repr__(self) -> str:
        return f"SesProvider(region={self.settings.region})"

    async def start(self) -> None:
        if self._client is not None:
            return
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        session = get_session()
        try:
            credentials = await session.get_credentials()
        except Exception as exc:  # the SDK's credential chain raises many kinds
            raise sdk_error(exc, self.settings.region) from None
        if credentials is None:
            raise sdk_error(_no_credentials(), self.settings.region)
        config = AioConfig(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=self.settings.timeout,
            read_timeout=self.settings.timeout,
            max_pool_connections=64,
        )
        stack = AsyncExitStack()
        self._client = await stack.enter_async_context(
            session.create_client(
                "sesv2",
                region_name=self.settings.region,
                endpoint_url=self.settings.endpoint,
                config=config,
            )
        )
        self._stack = stack

    def request(self, email: Email) -> dict[str, Any]:
        """The SendEmail parameters for `email`."""
        body: dict[str, Any] = {"Text": {"Data": email.text, "Charset": "UTF-8"}}
        if email.html:
            body["Html"] = {"Data": email.html, "Charset": "UTF-8"}
        digest = key_digest(email.delivery_key)
        params: dict[str, Any] = {
            "FromEmailAddress": self.settings.sender,
            "Destination": {"ToAddresses": [email.recipient]},
            "Content": {
                "Simple": {
                    "Subject": {"Data": email.subject, "Charset": "UTF-8"},
                    "Body": body,
                    "Headers": [{"Name": KEY_HEADER, "Value": digest}],
                }
            },
            "EmailTags": [
                {"Name": "leasebox_kind", "Value": email.kind},
                {"Name": "leasebox_outbox_id", "Value": str(email.outbox_id)},
                {"Name": "leasebox_key", "Value": digest},
            ],
        }
        if self.settings.configuration_set:
            params["ConfigurationSetName"] = self.settings.configuration_set
        return params

    async def send(self, email: Email) -> SendResult:
        if self._client is None:
            await self.start()
        try:
            answer = await self._client.send_email(**self.request(email))
        except Exception as exc:  # botocore's errors share no base class worth naming
            raise sdk_error(exc, self.settings.region) from None
        found = answer.get("MessageId")
        return SendResult(provider_message_id=found if isinstance(found, str) and found else None)

    async def check(self) -> str | None:
        return None if self._client is not None else "the ses provider is not started"

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()


def _no_credentials() -> BaseException:
    from botocore.exceptions import NoCredentialsError

    error: BaseException = NoCredentialsError()
    return error


def ses_provider_from_url(url: str, timeout: float) -> SesProvider:
    """`ses://REGION?from=...` (options `configuration_set`, `endpoint`, `timeout`)."""
    try:
        import aiobotocore  # noqa: F401
    except ImportError:
        raise ConfigurationError("ses:// needs the AWS SDK: pip install 'leasebox[ses]'") from None
    parsed = parse_provider_url(url)
    parsed.reject_unknown_options(option_names(URL_OPTIONS))
    region = (parsed.host or "").lower()
    if parsed.username or parsed.password is not None:
        raise ConfigurationError(
            "ses:// provider URL takes no credentials: the AWS SDK reads them from "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a shared credentials file or a role"
        )
    if not _REGION.fullmatch(region) or parsed.port or parsed.path not in ("", "/"):
        raise ConfigurationError(
            "ses:// provider URL is ses://REGION?from=..., e.g. ses://eu-west-1"
        )
    configuration_set = parsed.options.get("configuration_set") or None
    if configuration_set is not None and not re.fullmatch(
        r"[A-Za-z0-9_-]{1,64}", configuration_set
    ):
        raise ConfigurationError(
            "ses:// provider URL option configuration_set must be letters, digits, _ and -"
        )
    endpoint = read_endpoint(parsed, "") or None
    return SesProvider(
        SesSettings(
            region=region,
            sender=read_sender(parsed),
            endpoint=endpoint,
            configuration_set=configuration_set,
            timeout=parsed.float_option("timeout", timeout),
        )
    )
