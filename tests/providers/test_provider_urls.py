"""Provider URLs: every mistake is a one-line ConfigurationError that never shows a password."""

from __future__ import annotations

import importlib.metadata
import textwrap
from pathlib import Path

import pytest

from leasebox.delivery.providers import Email, Provider, provider_from_url
from leasebox.delivery.providers.development import LogProvider, NullProvider
from leasebox.delivery.providers.http import HttpProvider
from leasebox.delivery.providers.smtp import SmtpProvider
from leasebox.errors import ConfigurationError

PASSWORD = "hunter2"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "must start with a scheme"),
        (f"mail.example.com:{PASSWORD}@x", "must start with a scheme"),
        (f"smtp:user:{PASSWORD}@mail.example.com", "must start with a scheme"),
        (f"ftp://user:{PASSWORD}@mail.example.com", "unknown provider scheme 'ftp://'"),
        (f"smtp://user:{PASSWORD}@mail.example.com:notaport", "host or port cannot be read"),
        (f"smtp://user:{PASSWORD}@mail.example.com:99999", "host or port cannot be read"),
        (f"smtp://user:{PASSWORD}@mail.example.com:0", "port must be between 1 and 65535"),
        (f"smtp://user:{PASSWORD}/x@mail.example.com", "host or port cannot be read"),
        (f"smtp://user:{PASSWORD}?x@mail.example.com", "host or port cannot be read"),
        (f"smtp://user:{PASSWORD}@mail.example.com#frag", "must not have a '#' fragment"),
        (f"smtp://user:{PASSWORD}@/", "needs a host"),
        (f"smtp://:{PASSWORD}@mail.example.com", "has a password but no user name"),
        (f"smtp://user:{PASSWORD}@mail.example.com/inbox", "must not have a path"),
        (f"smtp://user:{PASSWORD}@mail.example.com?bogus=1", "unknown option 'bogus'"),
        (f"smtp://user:{PASSWORD}@mail.example.com?starttls=maybe", "'starttls' must be true or"),
        (f"smtp://user:{PASSWORD}@mail.example.com?timeout=-1", "'timeout' must be a positive"),
        (f"smtp://user:{PASSWORD}@mail.example.com?timeout=nan", "'timeout' must be a positive"),
        (f"smtp://user:{PASSWORD}@mail.example.com?pool_size=0", "'pool_size' must be a whole"),
        (f"smtp://user:{PASSWORD}@mail.example.com?from=nobody", "'from' must be an address"),
        (f"smtp://user:{PASSWORD}@mail.example.com?timeout", "must look like ?name=value"),
        (f"smtp://user:{PASSWORD}@mail.example.com?timeout=1&timeout=2", "repeats option"),
        (f"smtps://user:{PASSWORD}@mail.example.com?starttls=true", "smtps:// already uses TLS"),
        ("https://apikey@api.example.com/send", "has a user name but no token"),
        (f"https://:{PASSWORD}@api.example.com/send?token_env=X", "gives a token twice"),
        ("https://api.example.com/send?token_env=LEASEBOX_UNSET_VAR", "'LEASEBOX_UNSET_VAR'"),
        (f"https://:{PASSWORD}@/send", "needs a host"),
        (f"log://user:{PASSWORD}@host", "takes no host, path or credentials"),
        ("log://?stream=file", "'stream' must be stdout or stderr"),
        ("null://?delay=soon", "'delay' must be a positive number"),
        ("null://?speed=1", "unknown option 'speed'"),
    ],
)
def test_a_malformed_url_names_the_problem_and_never_the_password(
    url: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASEBOX_UNSET_VAR", raising=False)

    with pytest.raises(ConfigurationError) as caught:
        provider_from_url(url)

    message = str(caught.value)
    assert problem in message
    assert PASSWORD not in message
    assert "\n" not in message


def test_an_option_name_that_is_not_an_identifier_is_not_echoed() -> None:
    with pytest.raises(ConfigurationError) as caught:
        provider_from_url(f"smtp://mail.example.com?{PASSWORD}%21=1")

    assert PASSWORD not in str(caught.value)
    assert "not an identifier" in str(caught.value)


def test_an_smtp_url_becomes_settings_with_decoded_credentials_and_defaults() -> None:
    provider = provider_from_url("SMTP://postmaster:p%40ss%2Fw%3Ard@Mail.Example.com", timeout=7)

    assert isinstance(provider, SmtpProvider)
    settings = provider.settings
    assert (settings.host, settings.port) == ("mail.example.com", 25)
    assert (settings.username, settings.password) == ("postmaster", "p@ss/w:rd")
    assert settings.starttls is None
    assert settings.tls_verify is True
    assert settings.timeout == 7
    assert settings.pool_size == 8
    assert not settings.implicit_tls
    assert "p@ss" not in repr(provider)
    assert "p@ss" not in repr(settings)


def test_smtp_options_override_the_defaults() -> None:
    provider = provider_from_url(
        "smtp://mail:587?starttls=true&tls_verify=false&timeout=2.5&pool_size=3"
        "&from=Acme%20%3Cno-reply%40acme.test%3E",
        timeout=7,
    )

    assert isinstance(provider, SmtpProvider)
    settings = provider.settings
    assert (settings.port, settings.starttls, settings.tls_verify) == (587, True, False)
    assert (settings.timeout, settings.pool_size) == (2.5, 3)
    assert settings.sender == "Acme <no-reply@acme.test>"
    assert settings.envelope_sender == "no-reply@acme.test"


def test_smtps_uses_implicit_tls_on_port_465() -> None:
    provider = provider_from_url("smtps://user:pw@mail.example.com")

    assert isinstance(provider, SmtpProvider)
    assert provider.settings.implicit_tls
    assert provider.settings.port == 465


def test_an_http_url_keeps_only_the_endpoint_in_the_target() -> None:
    provider = provider_from_url(f"https://:{PASSWORD}@api.example.com:8443/v1/send?region=eu")

    assert isinstance(provider, HttpProvider)
    assert provider.settings.endpoint == "https://api.example.com:8443/v1/send?region=eu"
    assert provider.settings.target == "https://api.example.com:8443/v1/send"
    assert provider.settings.token == PASSWORD


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("smtp://mail.example.com", "smtp"),
        ("smtps://mail.example.com", "smtp"),
        ("http://api.example.com/send", "http"),
        ("https://api.example.com/send", "http"),
        ("log://", "log"),
        ("null://", "null"),
    ],
)
def test_every_built_in_scheme_gives_a_provider(url: str, name: str) -> None:
    provider = provider_from_url(url)

    assert isinstance(provider, Provider)
    assert provider.name == name


def test_development_schemes_build_their_providers() -> None:
    assert isinstance(provider_from_url("log://"), LogProvider)
    assert isinstance(provider_from_url("null://"), NullProvider)
    slow = provider_from_url("null://?delay=0.5")
    assert isinstance(slow, NullProvider)
    assert slow.delay == 0.5


SECRET_CODE = "604193"


def sample_email() -> Email:
    return Email(
        outbox_id=77,
        kind="otp",
        aggregate_id="user-5",
        delivery_key="otp:user-5:ch-2",
        recipient="linus.private@Example.ORG",
        subject=f"Code {SECRET_CODE}",
        text=f"Your code is {SECRET_CODE}",
        html=f"<b>{SECRET_CODE}</b>",
        attempt=2,
    )


async def test_the_log_provider_prints_one_redacted_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    provider = provider_from_url("log://")
    await provider.start()
    result = await provider.send(sample_email())
    await provider.close()

    out = capsys.readouterr().out
    assert out.count("\n") == 1
    for shown in ("outbox_id=77", "kind=otp", "delivery_key=otp:user-5:ch-2", "*@example.org"):
        assert shown in out
    for hidden in (SECRET_CODE, "linus.private", "Your code"):
        assert hidden not in out
    assert result.provider_message_id is not None
    assert result.provider_message_id in out


async def test_the_log_provider_can_print_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    provider = provider_from_url("log://?stream=stderr")
    await provider.send(sample_email())

    captured = capsys.readouterr()
    assert captured.out == ""
    assert "outbox_id=77" in captured.err


async def test_the_null_provider_accepts_with_a_deterministic_id() -> None:
    provider = provider_from_url("null://")

    first = await provider.send(sample_email())
    second = await provider.send(sample_email())

    assert first == second
    assert first.provider_message_id == "null:otp:user-5:ch-2"
    assert await provider.check() is None


def test_emails_do_not_show_recipient_subject_or_body_in_their_repr() -> None:
    shown = repr(sample_email())

    assert "outbox_id=77" in shown
    assert SECRET_CODE not in shown
    assert "linus.private" not in shown


PLUGIN = textwrap.dedent(
    """
    from leasebox.delivery.providers import SendResult

    class AcmeProvider:
        name = "acme"

        def __init__(self, url, timeout):
            self.url, self.timeout = url, timeout

        async def start(self): pass
        async def send(self, email): return SendResult(provider_message_id="acme-1")
        async def check(self): return None
        async def close(self): pass

    def factory(url, timeout):
        return AcmeProvider(url, timeout)

    def not_a_provider(url, timeout):
        return object()

    def angry(url, timeout):
        raise ValueError(f"cannot use {url}")

    BROKEN = 42
    """
)


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entry points of the `leasebox.providers` group, served from a module in tmp_path."""
    (tmp_path / "acme_mail_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    group = "leasebox.providers"
    points = [
        importlib.metadata.EntryPoint("acme", "acme_mail_plugin:factory", group),
        importlib.metadata.EntryPoint("hollow", "acme_mail_plugin:not_a_provider", group),
        importlib.metadata.EntryPoint("angry", "acme_mail_plugin:angry", group),
        importlib.metadata.EntryPoint("broken", "acme_mail_plugin:BROKEN", group),
        importlib.metadata.EntryPoint("missing", "no_such_module_here:factory", group),
        importlib.metadata.EntryPoint("smtp", "acme_mail_plugin:factory", group),
    ]
    real = importlib.metadata.entry_points

    def entry_points(**params: str) -> object:
        if params.get("group") == group:
            return importlib.metadata.EntryPoints(points)
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


@pytest.mark.usefixtures("plugins")
async def test_an_entry_point_provides_a_third_party_scheme() -> None:
    provider = provider_from_url(f"acme://key:{PASSWORD}@region-1", timeout=3.0)

    assert isinstance(provider, Provider)
    assert provider.name == "acme"
    assert (await provider.send(sample_email())).provider_message_id == "acme-1"


@pytest.mark.usefixtures("plugins")
def test_an_unknown_scheme_lists_the_plugin_schemes_too() -> None:
    with pytest.raises(ConfigurationError) as caught:
        provider_from_url("carrier-pigeon://loft")

    assert "'carrier-pigeon://'" in str(caught.value)
    assert "acme://" in str(caught.value)
    assert "smtp://" in str(caught.value)


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    ("scheme", "problem"),
    [
        ("hollow", "returned object, which lacks start/send/check/close"),
        ("angry", "rejected the URL: ValueError"),
        ("broken", "is not callable"),
        ("missing", "failed to load: ModuleNotFoundError"),
    ],
)
def test_a_faulty_plugin_is_a_configuration_error_without_the_password(
    scheme: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        provider_from_url(f"{scheme}://user:{PASSWORD}@host")

    assert problem in str(caught.value)
    assert PASSWORD not in str(caught.value)


@pytest.mark.usefixtures("plugins")
def test_a_plugin_cannot_take_over_a_built_in_scheme() -> None:
    assert isinstance(provider_from_url("smtp://mail.example.com"), SmtpProvider)
