"""`leasebox web`'s settings and identities: authentication is never silently off, roles come
from tokens or the proxy's groups, and a POST needs the form token of its own CSRF cookie."""

from __future__ import annotations

import pytest

from leasebox.cli.main import build_parser
from leasebox.cli.web import settings_of
from leasebox.errors import ConfigurationError
from leasebox.web.auth import CSRF_COOKIE, authenticate, csrf_problem, csrf_token
from leasebox.web.settings import WebSettings

DSN = "postgresql://leasebox@db/app"


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.7", "web.example.com", "::"])
def test_authentication_off_is_refused_off_loopback(host: str) -> None:
    with pytest.raises(ConfigurationError, match="allowed only on a loopback address"):
        WebSettings(dsn=DSN, host=host).check()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "localhost"])
def test_authentication_off_is_allowed_on_loopback(host: str) -> None:
    viewer = authenticate(WebSettings(dsn=DSN, host=host).check(), {}, {})
    assert viewer is not None
    assert viewer.operator


@pytest.mark.parametrize(
    ("tokens", "refusal"),
    [
        ({}, "needs LEASEBOX_WEB_TOKEN or LEASEBOX_WEB_OPERATOR_TOKEN"),
        ({"viewer_token": "short"}, "at least 16 characters"),
        ({"viewer_token": "v" * 20, "operator_token": "v" * 20}, "must differ"),
    ],
)
def test_token_mode_refuses_missing_short_or_equal_tokens(
    tokens: dict[str, str], refusal: str
) -> None:
    with pytest.raises(ConfigurationError, match=refusal):
        WebSettings(dsn=DSN, host="0.0.0.0", auth="token", **tokens).check()  # type: ignore[arg-type]


def test_a_token_gives_its_role_and_a_wrong_one_nothing() -> None:
    settings = WebSettings(
        dsn=DSN, host="0.0.0.0", auth="token", viewer_token="v" * 20, operator_token="o" * 20
    ).check()
    viewer = authenticate(settings, {"Authorization": f"Bearer {'v' * 20}"}, {})
    operator = authenticate(settings, {}, {"leasebox_token": "o" * 20})
    assert viewer is not None
    assert not viewer.operator
    assert operator is not None
    assert operator.operator
    assert authenticate(settings, {"Authorization": "Bearer " + "x" * 20}, {}) is None
    assert authenticate(settings, {}, {}) is None


def test_the_proxys_groups_give_the_operator_role() -> None:
    settings = WebSettings(
        dsn=DSN, host="0.0.0.0", auth="proxy", operator_groups=("oncall",)
    ).check()
    headers = {"X-Forwarded-User": "ada", "X-Forwarded-Groups": "readers, oncall"}
    ada = authenticate(settings, headers, {})
    grace = authenticate(settings, {"X-Forwarded-User": "grace"}, {})
    assert ada is not None
    assert (ada.name, ada.operator, ada.groups) == ("ada", True, ("readers", "oncall"))
    assert grace is not None
    assert not grace.operator
    assert authenticate(settings, {"X-Forwarded-User": "a\nb"}, {}) is None
    assert authenticate(settings, {}, {}) is None


def test_a_post_needs_the_form_token_of_its_own_csrf_cookie() -> None:
    settings = WebSettings(dsn=DSN, secret=b"k" * 32)
    good = csrf_token(settings, "cookie-1")
    cookies = {CSRF_COOKIE: "cookie-1"}
    assert csrf_problem(settings, {}, cookies, good) is None
    assert csrf_problem(settings, {"Sec-Fetch-Site": "same-origin"}, cookies, good) is None
    assert csrf_problem(settings, {}, {CSRF_COOKIE: "cookie-2"}, good) == (
        "the form's CSRF token does not match"
    )
    assert csrf_problem(settings, {}, {}, good) == "the form's CSRF token is missing"
    assert csrf_problem(settings, {"Sec-Fetch-Site": "cross-site"}, cookies, good) == (
        "a cross-site request (cross-site)"
    )


def test_the_command_line_reads_slas_tokens_and_the_csrf_key_from_where_they_belong() -> None:
    args = build_parser().parse_args(
        [
            "web",
            "--dsn",
            DSN,
            "--host",
            "0.0.0.0",
            "--auth",
            "token",
            "--sla",
            "30s",
            "--sla",
            "otp=10s",
            "--allow-actions",
        ]
    )
    environ = {"LEASEBOX_WEB_OPERATOR_TOKEN": "o" * 20, "LEASEBOX_WEB_SECRET": "shared"}
    settings = settings_of(args, environ)
    assert (settings.sla_of("otp"), settings.sla_of("invite")) == (10.0, 30.0)
    assert settings.operator_token == "o" * 20
    assert settings.viewer_token is None
    assert settings.secret == b"shared"
    assert settings.allow_actions
    assert "o" * 20 not in repr(settings)
    bad = build_parser().parse_args(["web", "--dsn", DSN, "--sla", "=10s"])
    with pytest.raises(ConfigurationError, match="name the kind"):
        settings_of(bad, {})
