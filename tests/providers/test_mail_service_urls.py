"""Mail-service URLs: where each one sends, and one clear line for every mistake in them."""

from __future__ import annotations

import pytest

from leasebox.delivery.providers import provider_from_url
from leasebox.delivery.providers.mail_api import MailApiProvider
from leasebox.delivery.providers.ses import SesProvider
from leasebox.errors import ConfigurationError

KEY = "key-in-env-5150"
FROM = "from=no-reply%40example.com"


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SENDGRID_API_KEY", "POSTMARK_SERVER_TOKEN", "MAILGUN_API_KEY", "RESEND_API_KEY"):
        monkeypatch.setenv(name, KEY)


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        (f"sendgrid://?{FROM}", "https://api.sendgrid.com/v3/mail/send"),
        (f"sendgrid://eu?{FROM}", "https://api.eu.sendgrid.com/v3/mail/send"),
        (f"postmark://?{FROM}", "https://api.postmarkapp.com/email"),
        (
            f"mailgun://us/mg.example.com?{FROM}",
            "https://api.mailgun.net/v3/mg.example.com/messages",
        ),
        (
            f"mailgun://eu/mg.example.com?{FROM}",
            "https://api.eu.mailgun.net/v3/mg.example.com/messages",
        ),
        (f"resend://?{FROM}", "https://api.resend.com/emails"),
        (
            f"resend://?{FROM}&endpoint=https://proxy.internal/resend/",
            "https://proxy.internal/resend/emails",
        ),
    ],
)
def test_each_service_posts_to_its_documented_endpoint(url: str, endpoint: str) -> None:
    provider = provider_from_url(url)
    assert isinstance(provider, MailApiProvider)
    assert provider.settings.endpoint == endpoint
    assert provider.settings.token == KEY
    assert KEY not in repr(provider.settings)


def test_ses_takes_its_region_and_configuration_set() -> None:
    provider = provider_from_url(f"ses://eu-central-1?{FROM}&configuration_set=otp-events")
    assert isinstance(provider, SesProvider)
    assert (provider.settings.region, provider.settings.configuration_set) == (
        "eu-central-1",
        "otp-events",
    )
    assert provider.settings.endpoint is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sendgrid://", "needs ?from=ADDRESS"),
        (f"sendgrid://asia?{FROM}", "sendgrid://eu"),
        (f"postmark://api.postmarkapp.com?{FROM}", "takes no host"),
        (f"mailgun://mg.example.com?{FROM}", "mailgun://us/DOMAIN"),
        (f"mailgun://eu/not_a_domain?{FROM}", "mailgun://us/DOMAIN"),
        (f"resend://?{FROM}&endpoint=http://mail.example.com", "must use https"),
        (f"resend://?{FROM}&endpoint=ftp://x", "must be an https:// URL"),
        (f"resend://?{FROM}&token_env=NOT_SET_ANYWHERE", "'NOT_SET_ANYWHERE', which is not set"),
        (f"resend://:k@?{FROM}&token_env=RESEND_API_KEY", "gives the API key twice"),
        (f"resend://?{FROM}&token_file=/nonexistent/key", "token_file cannot be read"),
        (f"resend://?{FROM}&colour=blue", "unknown option 'colour'"),
        (f"ses://moon-base?{FROM}", "ses://REGION"),
        (f"ses://AKID:secret@eu-west-1?{FROM}", "takes no credentials"),
        (f"ses://eu-west-1?{FROM}&configuration_set=a%20b", "configuration_set must be"),
    ],
)
def test_a_mistake_in_a_service_url_is_one_clear_line(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        provider_from_url(url)
    assert says in str(caught.value)
    assert "secret" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_service_without_any_key_names_the_variable_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POSTMARK_SERVER_TOKEN")
    monkeypatch.delenv("POSTMARK_API_TOKEN", raising=False)
    with pytest.raises(ConfigurationError, match="set POSTMARK_SERVER_TOKEN or POSTMARK_API_TOKEN"):
        provider_from_url(f"postmark://?{FROM}")
