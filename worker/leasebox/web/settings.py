"""What `leasebox web` is told: where the database is, who may look, who may act.

Authentication is never silently off: mode `none` is refused unless the server listens on a
loopback address only (the person at the machine is the only viewer). Mode `token` takes
bearer tokens from the environment (a Kubernetes Secret), one for viewers and one for
operators; mode `proxy` trusts the user and groups headers an authenticating proxy
(oauth2-proxy and the like) sets, and must only be reachable through it. Tokens are never
taken from a flag, where `ps` would show them.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from leasebox.db.queries import DEFAULT_SCHEMA
from leasebox.errors import ConfigurationError

AuthMode = Literal["none", "token", "proxy"]
AUTH_MODES: tuple[AuthMode, ...] = ("none", "token", "proxy")
# Names of environment variables, not their values.
TOKEN_VARIABLE = "LEASEBOX_WEB_TOKEN"  # noqa: S105
OPERATOR_TOKEN_VARIABLE = "LEASEBOX_WEB_OPERATOR_TOKEN"  # noqa: S105
SECRET_VARIABLE = "LEASEBOX_WEB_SECRET"  # noqa: S105
DEFAULT_PORT = 8080
DEFAULT_SLA_SECONDS = 60.0
DEFAULT_WINDOW_SECONDS = 300.0
MIN_TOKEN_LENGTH = 16


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class WebSettings:
    """Everything the application needs; `check()` refuses an unsafe combination."""

    dsn: str
    schema: str = DEFAULT_SCHEMA
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    auth: AuthMode = "none"
    viewer_token: str | None = field(default=None, repr=False)
    operator_token: str | None = field(default=None, repr=False)
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"
    operator_groups: tuple[str, ...] = ()
    allow_actions: bool = False
    sla_seconds: float = DEFAULT_SLA_SECONDS
    kind_sla_seconds: Mapping[str, float] = field(default_factory=dict)
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    # The key of the CSRF tokens: random per process unless given (several replicas).
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def check(self) -> WebSettings:
        if self.auth not in AUTH_MODES:
            raise ConfigurationError(f"--auth must be one of {', '.join(AUTH_MODES)}")
        if self.auth == "none" and not is_loopback(self.host):
            raise ConfigurationError(
                f"--auth none is allowed only on a loopback address, not on {self.host!r}: "
                "use --auth token (with LEASEBOX_WEB_TOKEN) or --auth proxy"
            )
        if self.auth == "token":
            tokens = [t for t in (self.viewer_token, self.operator_token) if t]
            if not tokens:
                raise ConfigurationError(
                    f"--auth token needs {TOKEN_VARIABLE} or {OPERATOR_TOKEN_VARIABLE}"
                )
            if any(len(t) < MIN_TOKEN_LENGTH for t in tokens):
                raise ConfigurationError(
                    f"web tokens must be at least {MIN_TOKEN_LENGTH} characters long"
                )
            if self.viewer_token and self.viewer_token == self.operator_token:
                raise ConfigurationError(
                    f"{TOKEN_VARIABLE} and {OPERATOR_TOKEN_VARIABLE} must differ"
                )
        if self.auth == "proxy" and not (self.user_header.strip() and self.groups_header.strip()):
            raise ConfigurationError("--user-header and --groups-header must not be empty")
        if self.sla_seconds <= 0 or any(v <= 0 for v in self.kind_sla_seconds.values()):
            raise ConfigurationError("an SLA must be a positive number of seconds")
        if self.window_seconds < 10:
            raise ConfigurationError("--window must be at least 10s")
        return self

    def sla_of(self, kind: str) -> float:
        """The SLA in seconds of a kind's oldest pending message."""
        return self.kind_sla_seconds.get(kind, self.sla_seconds)


def tokens_from(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The viewer and operator tokens and the CSRF key from the environment."""
    env = os.environ if environ is None else environ
    return {
        "viewer_token": env.get(TOKEN_VARIABLE, "").strip() or None,
        "operator_token": env.get(OPERATOR_TOKEN_VARIABLE, "").strip() or None,
        "secret": env.get(SECRET_VARIABLE, "").strip() or None,
    }
