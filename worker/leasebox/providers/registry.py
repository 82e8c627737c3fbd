"""Turning `LEASEBOX_PROVIDER_URL` into a provider, with errors that never show a password.

A URL is the one setting a person types for a provider, so every mistake in it (no scheme, an
unknown scheme, a port that is not a number, an option that does not exist) gets a one-line
`ConfigurationError` naming the problem. Values are never echoed: a password with an unescaped
`/`, `?` or `@` shifts the URL's parts, and whatever part it lands in must not reach a log.

Built-in schemes are resolved here; any other scheme is looked up in the `leasebox.providers`
entry-point group (entry point name = scheme, value = a callable `(url, timeout) -> Provider`).
"""

from __future__ import annotations

import importlib.metadata
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from leasebox.errors import ConfigurationError
from leasebox.providers.base import Provider

ENTRY_POINT_GROUP = "leasebox.providers"
BUILTIN_SCHEMES = ("smtp", "smtps", "http", "https", "log", "null")

ProviderFactory = Callable[[str, float], Provider]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_OPTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,40}$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class ProviderUrl:
    """The parts of a provider URL, percent-decoded; the password never shows in a repr."""

    scheme: str
    host: str | None
    port: int | None
    username: str | None
    password: str | None = field(repr=False)
    path: str
    options: Mapping[str, str]

    def reject_unknown_options(self, known: Collection[str]) -> None:
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            raise ConfigurationError(
                f"{self.scheme}:// provider URL has unknown option {_option_label(unknown[0])}; "
                f"known options: {', '.join(sorted(known)) or 'none'}"
            )

    def bool_option(self, name: str, default: bool) -> bool:
        raw = self.options.get(name)
        if raw is None:
            return default
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ConfigurationError(
            f"{self.scheme}:// provider URL option {name!r} must be true or false"
        )

    def float_option(self, name: str, default: float) -> float:
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise ConfigurationError(
                f"{self.scheme}:// provider URL option {name!r} must be a positive number"
            )
        return value

    def int_option(self, name: str, default: int, *, minimum: int = 1) -> int:
        raw = self.options.get(name)
        if raw is None:
            return default
        if not raw.isdigit() or int(raw) < minimum:
            raise ConfigurationError(
                f"{self.scheme}:// provider URL option {name!r} must be a whole number "
                f"of at least {minimum}"
            )
        return int(raw)


def _option_label(name: str) -> str:
    # A name that does not look like an option may be a piece of a misplaced password.
    return repr(name) if _OPTION_NAME.fullmatch(name) else "(a name that is not an identifier)"


def url_scheme(url: str) -> str:
    """The lower-cased scheme of a URL, or a `ConfigurationError` saying it has none."""
    match = _SCHEME.match(url.strip())
    if not match or not url.strip()[match.end() :].startswith("//"):
        raise ConfigurationError(
            "provider URL must start with a scheme such as smtp://, smtps://, https://, "
            "log:// or null://"
        )
    return match.group(1).lower()


def parse_provider_url(url: str) -> ProviderUrl:
    """Split a provider URL into its parts, validating host, port and option syntax."""
    scheme = url_scheme(url)
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise ConfigurationError(
            f"{scheme}:// provider URL is malformed: its host or port cannot be read "
            "(percent-encode '@', ':', '/', '?' and '#' in a user name or password)"
        ) from None
    if port == 0:
        raise ConfigurationError(f"{scheme}:// provider URL port must be between 1 and 65535")
    if parts.fragment:
        raise ConfigurationError(
            f"{scheme}:// provider URL must not have a '#' fragment "
            "(percent-encode '#' in a password as %23)"
        )
    options: dict[str, str] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ConfigurationError(
            f"{scheme}:// provider URL options must look like ?name=value&name=value"
        ) from None
    for name, value in pairs:
        if name in options:
            raise ConfigurationError(
                f"{scheme}:// provider URL repeats option {_option_label(name)}"
            )
        options[name] = value
    return ProviderUrl(
        scheme=scheme,
        host=parts.hostname,
        port=port,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        path=parts.path,
        options=options,
    )


def _entry_point_factories() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name.lower(): ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_builtin(scheme: str) -> ProviderFactory:
    # Imported on demand so that `log://` never pays for aiohttp or aiosmtplib.
    if scheme in ("smtp", "smtps"):
        from leasebox.providers.smtp import smtp_provider_from_url

        return smtp_provider_from_url
    if scheme in ("http", "https"):
        from leasebox.providers.http import http_provider_from_url

        return http_provider_from_url
    from leasebox.providers.development import development_provider_from_url

    return development_provider_from_url


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


def provider_from_url(url: str, *, timeout: float = 10.0) -> Provider:
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
