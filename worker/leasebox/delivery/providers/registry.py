"""Turning `LEASEBOX_PROVIDER_URL` into a provider: built-in schemes and entry-point plugins.

The URL's syntax is read by `urls`; here its scheme picks a factory, and whatever goes wrong
(an unknown scheme, a plugin that fails to load or rejects the URL) is one `ConfigurationError`
line that never quotes the URL, which may carry a password.

Built-in schemes are resolved here; any other scheme is looked up in the `leasebox.providers`
entry-point group (entry point name = scheme, value = a callable `(url, timeout) -> Provider`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Callable, Mapping
from pathlib import Path

from leasebox.config import PROVIDER_TIMEOUT
from leasebox.delivery.providers.base import Provider
from leasebox.delivery.providers.urls import UrlOption, url_scheme
from leasebox.errors import ConfigurationError

ENTRY_POINT_GROUP = "leasebox.providers"
BUILTIN_SCHEMES = (
    *("smtp", "smtps", "http", "https", "log", "null"),
    *("ses", "sendgrid", "postmark", "mailgun", "resend"),
)
# The environment variables a service reads its API key from when the URL names none.
CREDENTIAL_VARIABLES: dict[str, tuple[str, ...]] = {
    "sendgrid": ("SENDGRID_API_KEY",),
    "postmark": ("POSTMARK_SERVER_TOKEN", "POSTMARK_API_TOKEN"),
    "mailgun": ("MAILGUN_API_KEY",),
    "resend": ("RESEND_API_KEY",),
    "ses": ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
}

ProviderFactory = Callable[[str, float], Provider]


def _entry_point_factories() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name.lower(): ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_builtin(scheme: str) -> ProviderFactory:
    # Imported on demand so that `log://` never pays for aiohttp or aiosmtplib.
    if scheme in ("smtp", "smtps"):
        from leasebox.delivery.providers.smtp import smtp_provider_from_url

        return smtp_provider_from_url
    if scheme in ("http", "https"):
        from leasebox.delivery.providers.http import http_provider_from_url

        return http_provider_from_url
    if scheme in ("log", "null"):
        from leasebox.delivery.providers.development import development_provider_from_url

        return development_provider_from_url
    return _load_service(scheme)


def _load_service(scheme: str) -> ProviderFactory:
    if scheme == "ses":
        from leasebox.delivery.providers.ses import ses_provider_from_url

        return ses_provider_from_url
    if scheme == "sendgrid":
        from leasebox.delivery.providers.sendgrid import sendgrid_provider_from_url

        return sendgrid_provider_from_url
    if scheme == "postmark":
        from leasebox.delivery.providers.postmark import postmark_provider_from_url

        return postmark_provider_from_url
    if scheme == "mailgun":
        from leasebox.delivery.providers.mailgun import mailgun_provider_from_url

        return mailgun_provider_from_url
    from leasebox.delivery.providers.resend import resend_provider_from_url

    return resend_provider_from_url


def _load_plugin(scheme: str) -> ProviderFactory:
    plugins = _entry_point_factories()
    entry_point = plugins.get(scheme)
    if entry_point is None:
        known = sorted({*BUILTIN_SCHEMES, *plugins})
        raise ConfigurationError(
            f"unknown provider scheme {scheme + '://'!r}; known schemes: "
            f"{', '.join(s + '://' for s in known)} (others register in the "
            f"{ENTRY_POINT_GROUP!r} entry-point group)"
        )
    try:
        factory = entry_point.load()
    except Exception as exc:  # a broken plugin must become a configuration error
        raise ConfigurationError(
            f"provider plugin for {scheme}:// ({entry_point.value}) failed to load: "
            f"{type(exc).__name__}"
        ) from None
    if not callable(factory):
        raise ConfigurationError(
            f"provider plugin for {scheme}:// ({entry_point.value}) is not callable"
        )
    return factory  # type: ignore[no-any-return]


def provider_from_url(url: str, *, timeout: float = PROVIDER_TIMEOUT.default) -> Provider:
    """A provider for `url`; `ConfigurationError` on a malformed URL or an unknown scheme."""
    scheme = url_scheme(url)
    builtin = scheme in BUILTIN_SCHEMES
    factory = _load_builtin(scheme) if builtin else _load_plugin(scheme)
    if builtin:
        return factory(url, timeout)
    try:
        provider = factory(url, timeout)
    except ConfigurationError:
        raise
    except Exception as exc:  # the plugin's own message may quote the URL and its password
        raise ConfigurationError(
            f"provider plugin for {scheme}:// rejected the URL: {type(exc).__name__}"
        ) from None
    if not isinstance(provider, Provider):
        raise ConfigurationError(
            f"provider plugin for {scheme}:// returned {type(provider).__name__}, "
            "which lacks start/send/check/close"
        )
    return provider


def credential_values(url: str, environ: Mapping[str, str]) -> list[str]:
    """Every secret the provider of `url` may authenticate with, for the log masker.

    The URL's password, the variable named by `token_env`, the file named by `token_file`,
    and the service's usual variables (`SENDGRID_API_KEY`, `AWS_SECRET_ACCESS_KEY`, ...).
    Best effort: a URL that cannot be read yields what could be read, never an error.
    """
    from leasebox.delivery.providers.urls import parse_provider_url

    try:
        parsed = parse_provider_url(url)
    except ConfigurationError:
        return []
    found = [parsed.password or ""]
    name = parsed.options.get("token_env")
    if name:
        found.append(environ.get(name, ""))
    path = parsed.options.get("token_file")
    if path:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            found.append(Path(path).read_text("utf-8"))
    found.extend(environ.get(v, "") for v in CREDENTIAL_VARIABLES.get(parsed.scheme, ()))
    return [value.strip() for value in found if value.strip()]


def url_options() -> list[tuple[tuple[str, ...], tuple[UrlOption, ...]]]:
    """The options of every built-in scheme's URL, by the schemes that share them: what each
    provider accepts (it refuses any other), and what the README's reference table shows."""
    from leasebox.delivery.providers import development, http, mail_api, postmark, ses, smtp

    return [
        (("smtp", "smtps"), smtp.URL_OPTIONS),
        (("http", "https"), http.URL_OPTIONS),
        (("sendgrid", "postmark", "mailgun", "resend"), mail_api.COMMON_OPTIONS),
        (("postmark",), postmark.URL_OPTIONS),
        (("ses",), ses.URL_OPTIONS),
        (("log",), development.LOG_OPTIONS),
        (("null",), development.NULL_OPTIONS),
    ]
