"""`leasebox crd` and `leasebox operator`'s flags and settings, without running kopf."""

from __future__ import annotations

from pathlib import Path

import pytest

from leasebox.cli.main import build_parser, main
from leasebox.cli.operator import operator_settings
from leasebox.errors import ConfigurationError
from leasebox_operator.settings import OperatorSettings

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "outboxworkerpools.leasebox.dev.yaml"


def test_crd_command_prints_the_checked_in_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == CRD_FILE.read_text(encoding="utf-8")


def test_operator_flags_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEBOX_OPERATOR_STATEMENT_TIMEOUT", "2.5")
    args = build_parser().parse_args([
        "operator", "-n", "mail", "--namespace", "otp-*", "--standalone", "--liveness", "none",
        "--metrics-port", "9200", "--log-format", "plain", "--worker-image", "img:1",
    ])  # fmt: skip
    settings = operator_settings(args)
    assert settings.namespaces == ("mail", "otp-*")
    assert not settings.clusterwide
    assert settings.standalone
    assert settings.liveness_endpoint is None
    assert (settings.metrics_port, settings.log_format) == (9200, "plain")
    assert settings.worker_image == "img:1"
    assert settings.statement_timeout_seconds == 2.5
    assert settings.finalizer == "leasebox.dev/finalizer"


def test_a_random_priority_ranks_replicas_of_one_deployment_apart() -> None:
    priorities = {
        operator_settings(build_parser().parse_args(["operator", "--priority", "random"])).priority
        for _ in range(20)
    }
    assert len(priorities) == 20
    assert all(0 < p < 2**31 for p in priorities)


def test_a_priority_that_is_neither_a_number_nor_random_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["operator", "--priority", "high"])
    assert caught.value.code == 2
    assert "'high' is not a whole number or 'random'" in capsys.readouterr().err


def test_operator_defaults_to_all_namespaces_with_peering() -> None:
    settings = operator_settings(build_parser().parse_args(["operator"]))
    assert settings.clusterwide
    assert settings.namespaces == ()
    assert not settings.standalone
    assert settings.priority == 0
    assert settings.liveness_endpoint == "http://0.0.0.0:8080/healthz"
    assert settings.metrics_port == 9109


def test_namespace_and_all_namespaces_exclude_each_other(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["operator", "-n", "a", "--all-namespaces"])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_bad_environment_settings_are_one_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="LEASEBOX_OPERATOR_METRICS_PORT='x'"):
        OperatorSettings.from_environ({"LEASEBOX_OPERATOR_METRICS_PORT": "x"})
    with pytest.raises(ConfigurationError, match="not both"):
        OperatorSettings(namespaces=("a",), clusterwide=True)
    settings = OperatorSettings.from_environ({"LEASEBOX_OPERATOR_API_BACKOFFS": "0.2,0.5"})
    assert settings.api_backoffs == (0.2, 0.5)
    gather = OperatorSettings.from_environ({"LEASEBOX_OPERATOR_BACKLOG_GATHER": "0"})
    assert gather.backlog_gather_seconds == 0
    with pytest.raises(ConfigurationError, match="backlog_gather_seconds must be between"):
        OperatorSettings.from_environ({"LEASEBOX_OPERATOR_BACKLOG_GATHER": "5"})


def test_a_bad_operator_setting_exits_2_with_one_json_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.setenv("LEASEBOX_OPERATOR_METRICS_PORT", "lots")
    assert main(["operator", "--log-format", "json"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    entry = json.loads(line)
    assert (entry["level"], entry["command"], entry["exit_code"]) == ("critical", "operator", 2)
    assert entry["error"] == "ConfigurationError"
    assert "LEASEBOX_OPERATOR_METRICS_PORT='lots'" in entry["message"]


def test_the_operator_runs_on_the_event_loop_asked_for_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert build_parser().parse_args(["operator"]).event_loop == "auto"
    assert build_parser().parse_args(["operator", "--event-loop", " AsyncIO"]).event_loop == (
        "asyncio"
    )
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["operator", "--event-loop", "trio"])
    assert caught.value.code == 2
    assert "'trio': choose auto, asyncio or uvloop" in capsys.readouterr().err
