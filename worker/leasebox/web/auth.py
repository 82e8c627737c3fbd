"""Who is looking, and whether they may act: the viewer of one request.

Two roles: a viewer reads every page with recipients masked; an operator may also act
(requeue, purge) and sees recipients in full. The role comes from the token presented
(`Authorization: Bearer`, or the cookie the login form sets), from the groups an
authenticating proxy names, or, with authentication off on loopback, from being the person
at the machine. Tokens are compared in constant time; a header value that is not a short
printable line is no identity.

CSRF: every form carries a token derived (HMAC) from a random cookie of the browser's own,
and a POST whose form token does not match, or that a browser marks as cross-site
(`Sec-Fetch-Site`), is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from leasebox.web.settings import WebSettings

TOKEN_COOKIE = "leasebox_token"  # noqa: S105 (a cookie name)
CSRF_COOKIE = "leasebox_csrf"
_MAX_HEADER = 200
_SAME_SITE = frozenset({"same-origin", "none"})


@dataclass(frozen=True)
class Viewer:
    """The person behind a request, as far as the server can tell."""

    name: str
    operator: bool
    how: str
    groups: tuple[str, ...] = ()

    @property
    def role(self) -> str:
        return "operator" if self.operator else "viewer"


def _same(given: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(given.encode(), expected.encode())


def _header_value(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > _MAX_HEADER or not value.isprintable():
        return None
    return value


def bearer_token(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    """The token a request presents: its Authorization header, else the login cookie."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return cookies.get(TOKEN_COOKIE) or None


def viewer_of_token(settings: WebSettings, token: str | None) -> Viewer | None:
    """The viewer a token makes, or None for a wrong or missing token."""
    if not token:
        return None
    if _same(token, settings.operator_token):
        return Viewer("operator token", operator=True, how="token")
    if _same(token, settings.viewer_token):
        return Viewer("viewer token", operator=False, how="token")
    return None


def authenticate(
    settings: WebSettings, headers: Mapping[str, str], cookies: Mapping[str, str]
) -> Viewer | None:
    """The request's viewer, or None when it is not authenticated."""
    if settings.auth == "none":
        return Viewer("local user", operator=True, how="loopback")
    if settings.auth == "token":
        return viewer_of_token(settings, bearer_token(headers, cookies))
    user = _header_value(headers.get(settings.user_header))
    if user is None:
        return None
    listed = _header_value(headers.get(settings.groups_header)) or ""
    groups = tuple(g.strip() for g in listed.split(",") if g.strip())
    operator = any(group in settings.operator_groups for group in groups)
    return Viewer(user, operator=operator, how="proxy", groups=groups)


def new_csrf_cookie() -> str:
    return secrets.token_urlsafe(32)


def csrf_token(settings: WebSettings, cookie: str) -> str:
    """The form token that goes with a browser's CSRF cookie."""
    return hmac.new(settings.secret, cookie.encode(), hashlib.sha256).hexdigest()


def csrf_problem(
    settings: WebSettings,
    headers: Mapping[str, str],
    cookies: Mapping[str, str],
    submitted: str | None,
) -> str | None:
    """Why a POST fails the CSRF check, or None when it passes."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site not in _SAME_SITE:
        return f"a cross-site request ({site})"
    cookie = cookies.get(CSRF_COOKIE)
    if not cookie or not submitted:
        return "the form's CSRF token is missing"
    if not hmac.compare_digest(csrf_token(settings, cookie).encode(), submitted.encode()):
        return "the form's CSRF token does not match"
    return None
