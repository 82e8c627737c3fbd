"""Reading a provider URL into its parts, with errors that never show a password.

A URL is the one setting a person types for a provider, so every mistake in it (no scheme, a
port that is not a number, an option that does not exist, a malformed option) gets a one-line
`ConfigurationError` naming the problem. Values are never echoed: a password with an unescaped
`/`, `?` or `@` shifts the URL's parts, and whatever part it lands in must not reach a log.
Every provider parses its URL here, so that the registry, which imports the providers, is
imported by none of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from leasebox.errors import ConfigurationError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_OPTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,40}$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class UrlOption:
    """One `?name=value` option a provider's URL takes: the provider accepts exactly the
    options it declares, and the README's reference table is rendered from them."""

    name: str
    default: str
    meaning: str


def option_names(options: Iterable[UrlOption]) -> tuple[str, ...]:
    return tuple(option.name for option in options)


# The option every provider that talks to a server takes, with its one meaning.
TIMEOUT = UrlOption(
    "timeout",
    "`--provider-timeout` (10)",
    "seconds one request may take, and the longest wait for a free connection",
)


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
