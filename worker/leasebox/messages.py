"""What an application asks leasebox to send, validated before anything is written.

`OutboxMessage` is the producer's contract: every field is checked here so that a bad
request fails with an error naming the field and writes nothing. `Receipt` is what the
producer gets back: the same outbox id for a retried request.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

BUILTIN_KINDS = ("otp", "verification", "password_reset", "invite")
KIND_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
TEMPLATE_PATTERN = r"^[a-z0-9][a-z0-9_\-]*(/[a-z0-9][a-z0-9_\-]*)*$"
MAX_DATA_BYTES = 16 * 1024
MAX_SECRETS_BYTES = 4 * 1024
_EMAIL = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@"
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"
)


def _check_email(value: str) -> str:
    if not _EMAIL.fullmatch(value) or ".." in value:
        raise ValueError("not a valid email address")
    return value


Kind = Annotated[str, StringConstraints(pattern=KIND_PATTERN)]
EmailAddress = Annotated[str, StringConstraints(max_length=254), AfterValidator(_check_email)]


class OutboxMessage(BaseModel):
    """One logical send: who gets which template with which variables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind = Field(description="otp, verification, password_reset, invite or a user kind")
    recipient: EmailAddress
    template: str = Field(default="", max_length=100, description="defaults to the kind")
    aggregate_id: str | None = Field(default=None, max_length=200)
    data: dict[str, Any] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict, repr=False)
    delivery_key: str | None = Field(default=None, min_length=1, max_length=200)
    expires_at: datetime | None = None
    max_attempts: int | None = Field(
        default=None, ge=1, le=100, description="None: the worker's limit (default 8)"
    )
    available_at: datetime | None = None

    @field_validator("data")
    @classmethod
    def _data_is_small_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must be JSON-serialisable: {exc}") from None
        if len(encoded.encode()) > MAX_DATA_BYTES:
            raise ValueError(f"must encode to at most {MAX_DATA_BYTES} bytes of JSON")
        return value

    @field_validator("secrets")
    @classmethod
    def _secrets_are_small(cls, value: dict[str, str]) -> dict[str, str]:
        if sum(len(k) + len(v) for k, v in value.items()) > MAX_SECRETS_BYTES:
            raise ValueError(f"must hold at most {MAX_SECRETS_BYTES} characters")
        overlap = [k for k in value if not k.isidentifier()]
        if overlap:
            raise ValueError("keys must be identifiers (they become template variables)")
        return value

    @field_validator("expires_at", "available_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must be timezone-aware")
        return value

    @field_validator("delivery_key")
    @classmethod
    def _printable_key(cls, value: str | None) -> str | None:
        if value is not None and not all(c.isprintable() and not c.isspace() for c in value):
            raise ValueError("must be printable with no whitespace")
        return value

    @model_validator(mode="after")
    def _template_defaults_to_kind(self) -> OutboxMessage:
        if not self.template:
            object.__setattr__(self, "template", self.kind)
        if not re.fullmatch(TEMPLATE_PATTERN, self.template):
            raise ValueError(f"template {self.template!r} is not a valid template name")
        if self.expires_at is not None and self.expires_at <= datetime.now(UTC):
            raise ValueError("expires_at is already in the past")
        return self

    def request_hash(self) -> str:
        """Fingerprint of the request, for receipts; secrets and keys are left out on purpose.

        A retried API call generates a new OTP code but is the same request; what identifies
        it is who gets which template with which public variables.
        """
        canonical = json.dumps(
            {
                "kind": self.kind,
                "recipient": self.recipient.lower(),
                "template": self.template,
                "aggregate_id": self.aggregate_id,
                "data": self.data,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


class Receipt(BaseModel):
    """The result of `enqueue`: the logical send, and whether it was already there."""

    model_config = ConfigDict(frozen=True)

    outbox_id: int
    delivery_key: str
    reused: bool
    scope: str | None = None
    idempotency_key: str | None = None
