"""Condition bookkeeping follows metav1.Condition rules; specs parse with clear errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leasebox_operator import conditions
from leasebox_operator.conditions import ConditionUpdate
from leasebox_operator.errors import InvalidSpec
from leasebox_operator.models import Condition, PoolSpec
from leasebox_operator.reconcile import PoolParser, parse_pool

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _ready(value: bool, reason: str = "Reconciled") -> ConditionUpdate:
    return ConditionUpdate.of(conditions.READY, value, reason, "msg")


def test_transition_time_moves_only_when_the_status_flips() -> None:
    first = conditions.apply([], [_ready(True)], generation=1, now=T0)
    same = conditions.apply(first, [_ready(True, "Other")], generation=2,
                            now=T0 + timedelta(minutes=1))  # fmt: skip
    flipped = conditions.apply(same, [_ready(False, "InvalidSpec")], generation=3,
                               now=T0 + timedelta(minutes=2))  # fmt: skip
    assert first[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert same[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert same[0]["reason"] == "Other"
    assert same[0]["observedGeneration"] == 2
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T12:02:00Z"
    assert conditions.transitions(same, flipped) == [("Ready", "True", "False")]


def test_conditions_keep_a_stable_order_and_validate_as_metav1_conditions() -> None:
    updates = [
        ConditionUpdate.of(conditions.PAUSED, False, "Active", "m"),
        ConditionUpdate.of(conditions.DATABASE_REACHABLE, None, "Unknown", "m"),
        _ready(True),
    ]
    result = conditions.apply([], updates, generation=None, now=T0)
    assert [c["type"] for c in result] == ["Ready", "DatabaseReachable", "Paused"]
    assert result[1]["status"] == "Unknown"
    assert "observedGeneration" not in result[0]
    for condition in result:
        Condition.model_validate(condition)
    assert conditions.is_true(result, "Ready") is True
    assert conditions.is_true(result, "DatabaseReachable") is None


def test_apply_does_not_modify_its_input() -> None:
    before = conditions.apply([], [_ready(True)], generation=1, now=T0)
    snapshot = [dict(c) for c in before]
    conditions.apply(before, [_ready(False)], generation=2, now=T0)
    assert before == snapshot


def _body(spec: dict[str, Any], name: str = "otp") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "mail"}, "spec": spec}


BASE = {"kinds": ["otp"], "database": {"secretRef": {"name": "db"}},
        "provider": {"secretRef": {"name": "mail"}}}  # fmt: skip


def test_minimal_spec_gets_documented_defaults() -> None:
    spec = parse_pool(_body(BASE)).spec
    assert spec.database.secret_ref.key == "dsn"
    assert spec.provider.secret_ref.key == "url"
    assert spec.database.schema_name == "leasebox"
    assert (spec.scaling.min_replicas, spec.scaling.max_replicas) == (1, 10)
    assert spec.sla.oldest_pending_age_seconds == 60
    assert spec.worker.resources.requests == {"cpu": "100m", "memory": "128Mi"}
    assert spec.paused is False


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"scaling": {"minReplicas": 4, "maxReplicas": 2}},
         "spec.scaling: minReplicas must not exceed maxReplicas"),
        ({"kinds": ["otp", "otp"]}, "spec.kinds: kinds must not repeat"),
        ({"worker": {"concurrency": 0}}, "spec.worker.concurrency"),
        ({"pollIntervalSeconds": 1}, "spec.pollIntervalSeconds: Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_invalid_spec_is_described_by_field_without_echoing_values(
    change: dict[str, Any], expected: str
) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_pool(_body(BASE | change))
    assert expected in caught.value.message
    assert "input_value" not in caught.value.message


def test_a_pool_name_too_long_for_pod_labels_is_invalid() -> None:
    with pytest.raises(InvalidSpec, match=r"metadata\.name"):
        parse_pool(_body(BASE, name="p" * 60))


def test_a_poll_loop_parses_its_live_body_again_only_when_the_generation_moves() -> None:
    parse = PoolParser()
    body = _body(BASE) | {"metadata": {"name": "otp", "namespace": "mail", "generation": 1}}
    first = parse(body)
    assert parse(body) is first
    body["spec"] = BASE | {"paused": True}
    assert parse(body) is first  # kopf moves the generation with every change of the spec
    body["metadata"]["generation"] = 2
    assert parse(body).spec.paused is True
    body["spec"] = BASE | {"kinds": []}
    body["metadata"]["generation"] = 3
    for _ in range(2):  # a rejected spec is parsed, and refused, every time
        with pytest.raises(InvalidSpec):
            parse(body)


def test_a_body_without_a_generation_is_parsed_every_time() -> None:
    parse = PoolParser()
    body = _body(BASE)
    first = parse(body)
    assert parse(body) is not first
    assert parse(body) == first


def test_models_round_trip_through_their_camel_case_form() -> None:
    spec = PoolSpec.model_validate(BASE | {"scaling": {"maxScaleUpStep": 3}})
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["scaling"]["maxScaleUpStep"] == 3
    assert PoolSpec.model_validate(dumped) == spec
