"""One table configures the worker: flags, variables, defaults and the operator's env agree."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from leasebox import config as options
from leasebox.cli.main import build_parser
from leasebox.cli.worker import process_config, read_options
from leasebox.config import OPTIONS, Style, Target
from leasebox.errors import ConfigurationError
from leasebox.runtime.process import ProcessConfig
from leasebox.runtime.settings import WorkerSettings
from support.worker_options import REQUIRED, SAMPLES


def test_the_samples_cover_every_option_with_a_value_other_than_its_default() -> None:
    assert set(SAMPLES) == {option.name for option in OPTIONS}
    for option in OPTIONS:
        assert SAMPLES[option.name] != option.default, option.name


def test_every_variable_is_distinct_and_prefixed() -> None:
    variables = [option.variable for option in OPTIONS]
    assert len(set(variables)) == len(variables)
    assert all(v.startswith("LEASEBOX_") for v in variables)


def test_the_settings_defaults_are_the_tables() -> None:
    fields = {f.name: f for f in dataclasses.fields(WorkerSettings)}
    for option in OPTIONS:
        if option.target is Target.SETTINGS and option.default is not None:
            assert fields[option.name].default == option.default, option.name
    assert fields["batch_size"].default == options.CONCURRENCY.default


def test_every_option_round_trips_through_the_environment_the_operator_writes() -> None:
    environ = dict(options.environment(SAMPLES)) | REQUIRED
    args = build_parser().parse_args(["worker"])
    assert read_options(args, environ) == SAMPLES
    config = process_config(args, environ)
    for option in OPTIONS:
        holder: WorkerSettings | ProcessConfig = (
            config.settings if option.target is Target.SETTINGS else config
        )
        if hasattr(holder, option.name):
            assert getattr(holder, option.name) == SAMPLES[option.name], option.name


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.style is Style.VALUE], ids=lambda o: o.variable
)
def test_a_flag_wins_over_its_variable(option: options.Option[Any]) -> None:
    environ = {option.variable: option.render(option.default or SAMPLES[option.name])}
    args = build_parser().parse_args(["worker", option.flag, option.render(SAMPLES[option.name])])
    assert read_options(args, environ)[option.name] == SAMPLES[option.name]


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.style is not Style.VALUE], ids=lambda o: o.variable
)
def test_a_switch_flag_wins_over_its_variable(option: options.Option[Any]) -> None:
    environ = {option.variable: option.render(option.default)}
    args = build_parser().parse_args(["worker", option.flag])
    assert read_options(args, environ)[option.name] == SAMPLES[option.name]


def test_the_help_names_every_flag_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for option in OPTIONS:
        assert option.flag in shown
        assert f"[{option.variable}]" in shown


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("LEASEBOX_CONCURRENCY", "many", "LEASEBOX_CONCURRENCY must be a whole number"),
        ("LEASEBOX_LEASE_SECONDS", "inf", "LEASEBOX_LEASE_SECONDS must be a finite number"),
        ("LEASEBOX_DRAIN", "maybe", "LEASEBOX_DRAIN must be true or false"),
        ("LEASEBOX_SCHEMA", "Mail-Box", "LEASEBOX_SCHEMA: invalid schema name"),
        ("LEASEBOX_EVENT_LOOP", "tokio", "LEASEBOX_EVENT_LOOP must be auto, asyncio or uvloop"),
        ("LEASEBOX_RETENTION", "forever", "LEASEBOX_RETENTION must be a duration such as 90s"),
        ("LEASEBOX_FEEDBACK_PROVIDER_DAYS", "soon", "LEASEBOX_FEEDBACK_PROVIDER_DAYS must be"),
    ],
)
def test_a_malformed_variable_is_one_error_naming_it(variable: str, raw: str, message: str) -> None:
    args = build_parser().parse_args(["worker"])
    with pytest.raises(ConfigurationError, match=message):
        read_options(args, {variable: raw})


def test_the_environment_refuses_a_name_that_is_no_setting() -> None:
    with pytest.raises(KeyError, match="not worker settings: colour"):
        options.environment({"colour": "blue"})


LOG_PROVIDER = {**REQUIRED, "LEASEBOX_PROVIDER_URL": "log://"}


@pytest.mark.parametrize(
    ("raw", "seconds"), [("7d", 7 * 86400.0), ("2w", 14 * 86400.0), ("36h", 36 * 3600.0)]
)
def test_the_retention_reads_as_a_duration(raw: str, seconds: float) -> None:
    args = build_parser().parse_args(["worker", "--retention", raw])
    config = process_config(args, LOG_PROVIDER)
    assert config.settings.retention_seconds == seconds


def test_without_a_retention_the_worker_keeps_everything() -> None:
    config = process_config(build_parser().parse_args(["worker"]), LOG_PROVIDER)
    assert config.settings.retention_seconds is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("12h", "the retention must be at least a day \\(the receipt TTL\\), got 43200s"),
        ("86399", "the retention must be at least a day"),
        ("36501d", "the retention must be at most 36500d"),
    ],
)
def test_a_retention_that_could_resend_or_overflow_is_refused_at_start(
    raw: str, message: str
) -> None:
    args = build_parser().parse_args(["worker", "--retention", raw])
    with pytest.raises(ConfigurationError, match=message):
        process_config(args, LOG_PROVIDER)


def test_a_provider_suppression_of_no_days_is_refused_at_start() -> None:
    args = build_parser().parse_args(["worker", "--feedback-provider-days", "0"])
    with pytest.raises(ConfigurationError, match="provider suppression must be positive"):
        process_config(args, LOG_PROVIDER)


def test_a_retention_of_exactly_a_day_is_accepted() -> None:
    assert WorkerSettings(retention_seconds=86400.0).retention_seconds == 86400.0


def test_a_refused_retention_names_the_variable_it_came_from() -> None:
    args = build_parser().parse_args(["worker"])
    with pytest.raises(ConfigurationError, match=r"^LEASEBOX_RETENTION: the retention must be"):
        process_config(args, {**LOG_PROVIDER, "LEASEBOX_RETENTION": "6h"})
    args = build_parser().parse_args(["worker", "--retention", "6h"])
    with pytest.raises(ConfigurationError, match=r"^--retention: the retention must be"):
        process_config(args, LOG_PROVIDER)


@pytest.mark.parametrize(
    ("raw", "per_second"),
    [("14", 14.0), ("14/s", 14.0), ("600/m", 10.0), ("86400/d", 1.0), ("5/10s", 0.5)],
)
def test_a_quota_reads_as_messages_per_period(raw: str, per_second: float) -> None:
    args = build_parser().parse_args(["worker", "--quota", raw])
    config = process_config(args, LOG_PROVIDER)
    assert config.settings.quota_rate == per_second
    assert config.settings.burst == max(1, math.ceil(per_second))


def test_a_quota_is_for_the_provider_account_its_url_names_without_credentials() -> None:
    url = "smtp://user:s3cret@mail.example.com:587?starttls=true"
    args = build_parser().parse_args(["worker", "--quota", "14/s"])
    config = process_config(args, {**REQUIRED, "LEASEBOX_PROVIDER_URL": url})
    assert config.settings.quota_account == "smtp://mail.example.com:587"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--quota", "fast"], "--quota must be a number"),
        (["--quota", "0/s"], "--quota must be a positive rate such as 14/s"),
        (["--quota", "14/fortnight"], "--quota must be a duration"),
        (["--quota-burst", "5"], "a quota burst or account needs a quota rate"),
        (["--quota", "14/s", "--quota-burst", "0"], "^--quota-burst: the quota burst must be"),
    ],
)
def test_a_bad_quota_is_one_error_naming_its_flag(argv: list[str], message: str) -> None:
    args = build_parser().parse_args(["worker", *argv])
    with pytest.raises(ConfigurationError, match=message):
        process_config(args, LOG_PROVIDER)


def test_priorities_read_as_kind_priority_and_aging() -> None:
    args = build_parser().parse_args(
        ["worker", "--kinds", "otp,verification,invite", "--priorities", "otp=10/30s,invite=-1"]
    )
    settings = process_config(args, LOG_PROVIDER).settings
    assert settings.priority_of == {"otp": 10, "verification": 0, "invite": -1}
    assert settings.aging_of == {"otp": 30.0, "verification": 60.0, "invite": 60.0}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("otp", "^--priorities must be kind=priority pairs"),
        ("otp=urgent", "^--priorities must be a whole number as the priority of otp"),
        ("otp=1/soon", "^--priorities must be a duration"),
        ("sms=1", "^--priorities: a priority names kind 'sms', which this worker does not"),
        ("otp=1,otp=2", "^--priorities: the priorities name a kind twice"),
    ],
)
def test_a_bad_priority_is_one_error_naming_its_flag(raw: str, message: str) -> None:
    args = build_parser().parse_args(["worker", "--kinds", "otp", "--priorities", raw])
    with pytest.raises(ConfigurationError, match=message):
        process_config(args, LOG_PROVIDER)
