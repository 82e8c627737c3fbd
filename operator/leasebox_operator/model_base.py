"""The building blocks of the resource models: a strict base model, CEL rules, common types.

Every model of the `OutboxWorkerPool` API derives from `Model`: camelCase on the wire,
unknown fields refused, frozen, attribute docstrings as schema descriptions. A rule that
relates fields is a `CelRule`: its CEL goes into the CRD as `x-kubernetes-validations`, so
the API server refuses the object, and its Python predicate runs when the operator reads
a spec, so a cluster without the CRD's rules (or a test without a cluster) refuses the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, StringConstraints, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUALIFIED_NAME = r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

ResourceName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
]
QualifiedName = Annotated[str, StringConstraints(max_length=317, pattern=QUALIFIED_NAME)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    ),
]


@dataclass(frozen=True)
class CelRule:
    """A cross-field rule: CEL for the API server, a Python predicate for the operator."""

    rule: str
    message: str
    check: Callable[[Any], bool]

    def as_validation(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


def cel(rules: tuple[CelRule, ...]) -> ConfigDict:
    """A model config carrying `rules` into the model's JSON schema (and so the CRD)."""
    validations: list[Any] = [r.as_validation() for r in rules]
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})


class Model(BaseModel):
    """camelCase on the wire, unknown fields refused, attribute docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Model:
        for rule in self.cel_rules:
            if not rule.check(self):
                raise ValueError(rule.message)
        return self
