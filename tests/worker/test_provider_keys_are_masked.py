"""Every API key a mail service may use is masked in the worker's logs, wherever it came from."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from leasebox.runtime.logs import configure_logging, remove_logging
from leasebox.runtime.process import ProcessConfig, secret_values
from leasebox.runtime.settings import WorkerSettings

DSN = "postgresql://leasebox:db-password-1@db/app"


def config(url: str) -> ProcessConfig:
    return ProcessConfig(settings=WorkerSettings(), dsn=DSN, provider_url=url)


@pytest.mark.parametrize(
    ("url", "environ", "secret"),
    [
        ("sendgrid://?from=a%40example.com", {"SENDGRID_API_KEY": "SG.abc123"}, "SG.abc123"),
        ("postmark://?from=a%40example.com", {"POSTMARK_SERVER_TOKEN": "pm-tok-9"}, "pm-tok-9"),
        ("mailgun://eu/mg.example.com?from=a%40b.c", {"MAILGUN_API_KEY": "key-mg-77"}, "key-mg-77"),
        ("resend://?from=a%40example.com", {"RESEND_API_KEY": "re_live_5"}, "re_live_5"),
        ("resend://?from=a%40example.com&token_env=MY_KEY", {"MY_KEY": "re_named_6"}, "re_named_6"),
        (
            "ses://eu-west-1?from=a%40example.com",
            {"AWS_SECRET_ACCESS_KEY": "aws/s3cr3t"},
            "aws/s3cr3t",
        ),
        (
            "ses://eu-west-1?from=a%40example.com",
            {"AWS_SESSION_TOKEN": "aws-session-1"},
            "aws-session-1",
        ),
        ("resend://:re_in_url_8@?from=a%40example.com", {}, "re_in_url_8"),
    ],
)
def test_the_services_keys_are_secret_values(
    url: str, environ: dict[str, str], secret: str
) -> None:
    values = secret_values(config(url), environ)

    assert secret in values
    assert "db-password-1" in values


def test_a_key_read_from_a_mounted_secret_file_is_masked_in_log_lines(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("pm-file-token-31\n")
    url = f"postmark://?from=a%40example.com&token_file={secret}"
    stream = io.StringIO()
    handler = configure_logging("text", "info", stream=stream, mask=secret_values(config(url), {}))
    try:
        logging.getLogger("leasebox.worker").warning("upstream said pm-file-token-31 is bad")
    finally:
        remove_logging(handler)

    assert "pm-file-token-31" not in stream.getvalue()
    assert "upstream said" in stream.getvalue()


def test_an_unreadable_url_yields_no_secret_and_no_error() -> None:
    assert secret_values(config("not a url"), {"SENDGRID_API_KEY": "SG.x"}) == ["db-password-1"]
