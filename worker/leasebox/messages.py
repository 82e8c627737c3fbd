"""What an application asks leasebox to send, validated before anything is written.

`OutboxMessage` is the producer's contract: every field is checked here so that a bad
request fails with an error naming the field and writes nothing. That includes what
PostgreSQL cannot store (a NUL byte, a lone UTF-16 surrogate), which would otherwise abort
the caller's whole transaction from inside the database. `Receipt` is what the producer gets
back: the same outbox id for a retried request.

Recipients are normalised once, here (`recipient_key`: the mailbox an address reaches,
trimmed, case-folded, the domain in its IDNA ASCII form, and a tag or dots dropped where the
domain's mail service ignores them), for everything that counts or compares mailboxes: the
abuse guard and its index, the suppression list. The address as given (trimmed) is what is
sent.

On the worker's side, `LazyJsonLoader` reads a claimed row's `data` as a `JsonObject`, which
decodes its JSON only when a provider that reads content first looks inside: a worker that
sends through `null://` (or fails a row before rendering) never pays for the decoding.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from leasebox.addresses import address_key, ascii_domain, mailbox_key
from leasebox.errors import InvalidMessage, InvalidRequest, UnreadableData

# Encoders made once: `json.dumps` with arguments builds an encoder on every call, which is
# half of its cost for a message's small objects (a message is encoded for its size check,
# then for its fingerprint). `STORED_JSON` is also how a batch's data goes to the database.
STORED_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_CANONICAL_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)

BUILTIN_KINDS = ("otp", "verification", "password_reset", "invite")
KIND_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
TEMPLATE_PATTERN = r"^[a-z0-9][a-z0-9_\-]*(/[a-z0-9][a-z0-9_\-]*)*$"
MAX_DATA_BYTES = 16 * 1024
# How long a receipt turns a retried request into the same send, unless the caller says.
DEFAULT_RECEIPT_TTL_SECONDS = 24 * 3600.0
MAX_SECRETS_BYTES = 4 * 1024
# The deepest `data` may nest (objects and arrays): far beyond any template's needs, far short
# of where decoding it would exhaust the interpreter's stack.
MAX_DATA_DEPTH = 32
# The longest idempotency key, scope or request hash: a receipt's key must fit an index entry.
MAX_KEY_LENGTH = 255
_LOCAL_PART = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}$")
_DOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
    r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+$"
)
# What a PostgreSQL text or jsonb value cannot hold: NUL, and UTF-16 surrogates, which have
# no UTF-8 encoding (Python lets a lone one into a str; the database refuses it).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NOT_VISIBLE_ASCII = re.compile(r"[^\x21-\x7e]")


def unstorable(text: str) -> bool:
    """Whether `text` holds a character PostgreSQL cannot store (NUL, a lone surrogate)."""
    return _UNSTORABLE.search(text) is not None


def visible(text: str) -> bool:
    """Whether every character of `text` is printable and none is whitespace."""
    if text.isascii():  # the common case, by one regular expression instead of a loop
        return _NOT_VISIBLE_ASCII.search(text) is None
    return all(c.isprintable() and not c.isspace() for c in text)


def recipient_key(address: str) -> str:
    """The one normalised form of an address that every count and comparison uses: the
    mailbox it reaches (`leasebox.addresses.mailbox_key`), so that `Ada@Example.com` and
    `ada@example.com`, `ada@bücher.de` and `ada@xn--bcher-kva.de`, or `A.B+x@gmail.com` and
    `ab@gmail.com` count as one recipient: letter case, a domain's form, or a tag its mail
    service ignores never get past a limit or a suppression."""
    return mailbox_key(address)


def _check_email(value: str) -> str:
    address = value.strip()
    if not visible(address):  # NUL and lone surrogates are not printable either
        raise ValueError("not a valid email address: it holds a control or space character")
    local, at, domain = address.rpartition("@")
    if not at or not _LOCAL_PART.fullmatch(local) or ".." in local:
        raise ValueError("not a valid email address")
    wire_domain = ascii_domain(domain) if domain else ""
    if not _DOMAIN.fullmatch(wire_domain) or len(local) + 1 + len(wire_domain) > 254:
        raise ValueError("not a valid email address")
    return address


def _storable_text(value: str | None) -> str | None:
    if value is not None and unstorable(value):
        raise ValueError("must not contain a NUL byte or a lone surrogate character")
    return value


def too_deep(value: Any, limit: int = MAX_DATA_DEPTH) -> bool:
    """Whether objects and arrays nest more than `limit` levels deep in `value` (looked at
    level by level, without recursion, so any depth is measured safely)."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list | tuple)
        ]
        if not level:
            return False
    return True


def check_request_key(argument: str, value: str | None, *, empty: bool = False) -> None:
    """Refuse an idempotency key, scope or request hash that cannot be used, before any SQL:
    `InvalidRequest` naming `argument` (`idempotency_key`), never quoting the value."""
    if value is None:
        return
    name = argument.replace("_", " ")
    if not isinstance(value, str):
        raise InvalidRequest(f"the {name} must be text, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidRequest(f"the {name} must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidRequest(
            f"the {name} is {len(value)} characters long; at most {MAX_KEY_LENGTH} are allowed"
        )
    if not value.isprintable():
        raise InvalidRequest(
            f"the {name} holds a character that is not printable (a control character, a NUL "
            "byte, a line break or a lone surrogate)"
        )


def _unstorable_strings(value: Any) -> bool:
    """Whether any key or string anywhere in a JSON-like value is unstorable."""
    if isinstance(value, str):
        return unstorable(value)
    if isinstance(value, dict):
        return any(_unstorable_strings(k) or _unstorable_strings(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_unstorable_strings(item) for item in value)
    return False


def refusal(exc: ValidationError) -> InvalidMessage:
    """pydantic's report as one line naming the first field refused (and how many more).

    Only the field's path and pydantic's description of the problem are kept: with
    `hide_input_in_errors` neither quotes the value, which may be a secret.
    """
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    fields: list[str] = []
    for error in errors:
        name = ".".join(str(part) for part in error["loc"]) or "message"
        if name not in fields:
            fields.append(name)
    problem = " ".join(str(errors[0]["msg"]).removeprefix("Value error, ").split())
    return InvalidMessage(fields[0], problem, others=fields[1:])


def _check_kind(value: str) -> str:
    if not re.fullmatch(KIND_PATTERN, value):
        raise ValueError(
            "must start with a lower-case letter, then up to 62 lower-case letters, digits or '_'"
        )
    return value


Kind = Annotated[str, AfterValidator(_check_kind)]
EmailAddress = Annotated[str, StringConstraints(max_length=300), AfterValidator(_check_email)]
StorableText = Annotated[str, AfterValidator(_storable_text)]


class OutboxMessage(BaseModel):
    """One logical send: who gets which template with which variables.

    `replacement_key` makes "resend code" safe: messages with the same key replace one
    another, so enqueuing one supersedes every older message of the key not yet written to
    the wire (pending ones in the same transaction, a claimed one at the worker's check
    right before the wire). It is an explicit key, such as the challenge's id, rather than
    "same aggregate id and kind", because an aggregate (a user) may hold two live
    challenges of one kind at once (a login and an email change), which must not cancel
    each other; and because only a message that has a key can be superseded, only those
    pay for the worker's check against the database before the wire. It is a field of the
    message, not an argument of `enqueue`, so that `enqueue_many`, the ORM adapters and
    `leasebox enqueue` carry it per message as they carry the rest.
    """

    # Errors never quote what they refused: it may be a secret.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    kind: Kind = Field(description="otp, verification, password_reset, invite or a user kind")
    recipient: EmailAddress
    template: str = Field(default="", max_length=100, description="defaults to the kind")
    aggregate_id: StorableText | None = Field(default=None, max_length=200)
    data: dict[str, Any] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict, repr=False)
    delivery_key: str | None = Field(default=None, min_length=1, max_length=200)
    expires_at: datetime | None = None
    max_attempts: int | None = Field(
        default=None, ge=1, le=100, description="None: the worker's limit (default 8)"
    )
    available_at: datetime | None = None
    replacement_key: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("data")
    @classmethod
    def _data_is_small_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        if too_deep(value):
            raise ValueError(f"must not be nested more than {MAX_DATA_DEPTH} levels deep")
        try:
            encoded = STORED_JSON.encode(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must be JSON-serialisable: {exc}") from None
        if _unstorable_strings(value):
            raise ValueError("must not contain a NUL byte or a lone surrogate character")
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
        if any(unstorable(v) for v in value.values()):
            raise ValueError("must not contain a NUL byte or a lone surrogate character")
        return value

    @field_validator("expires_at", "available_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must be timezone-aware")
        return value

    @field_validator("expires_at")
    @classmethod
    def _ahead(cls, value: datetime | None) -> datetime | None:
        if value is not None and value <= datetime.now(UTC):
            raise ValueError("is already in the past")
        return value

    @field_validator("template")
    @classmethod
    def _template_name(cls, value: str) -> str:
        if value and not re.fullmatch(TEMPLATE_PATTERN, value):
            raise ValueError(
                "is not a valid template name: lower-case letters, digits, '_' and '-', "
                "in parts separated by '/'"
            )
        return value

    @field_validator("delivery_key", "replacement_key")
    @classmethod
    def _printable_key(cls, value: str | None) -> str | None:
        if value is not None and not visible(value):
            raise ValueError("must be printable with no whitespace")
        return value

    @model_validator(mode="after")
    def _template_defaults_to_kind(self) -> OutboxMessage:
        if not self.template:
            object.__setattr__(self, "template", self.kind)
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _one_line_errors(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        # pydantic's report spans lines and speaks of pydantic; a caller wants one line
        # naming the field, and the report itself stays at hand as the cause.
        try:
            return handler(data)
        except ValidationError as exc:
            raise refusal(exc) from exc

    @property
    def recipient_key(self) -> str:
        """The recipient in the normalised form every count and comparison uses."""
        return recipient_key(self.recipient)

    def request_hash(self) -> str:
        """Fingerprint of the request, for receipts; secrets and keys are left out on purpose.

        A retried API call generates a new OTP code but is the same request; what identifies
        it is who gets which template with which public variables.
        """
        canonical = _CANONICAL_JSON.encode(
            {
                "kind": self.kind,
                # The address's own form: a retried request that spells a mailbox
                # another way is another request, as it was before mailbox keys.
                "recipient": address_key(self.recipient),
                "template": self.template,
                "aggregate_id": self.aggregate_id,
                "data": self.data,
            }
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


class JsonObject(Mapping[str, Any]):
    """A JSON object from the database, decoded on first use (then like a read-only dict)."""

    __slots__ = ("_decoded", "_raw")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._decoded: dict[str, Any] | None = None

    def _value(self) -> dict[str, Any]:
        if self._decoded is None:
            try:
                value = json.loads(self._raw)
            except RecursionError:
                raise UnreadableData(
                    "its data is nested too deeply to be decoded (written around the "
                    f"producer, which allows {MAX_DATA_DEPTH} levels)"
                ) from None
            self._decoded = value if isinstance(value, dict) else {"value": value}
        return self._decoded

    def __getitem__(self, key: str) -> Any:
        return self._value()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._value())

    def __len__(self) -> int:
        return len(self._value())

    def __repr__(self) -> str:
        return f"JsonObject({self._value()!r})"


class LazyJsonLoader(Loader):
    """Loads `jsonb` (text format) as a `JsonObject` that is decoded only when read."""

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)

    def load(self, data: Buffer) -> JsonObject:
        return JsonObject(bytes(data))


class LazyJsonBinaryLoader(LazyJsonLoader):
    """`LazyJsonLoader` for `jsonb` in the binary format: a version byte, then the text."""

    format = Format.BINARY

    def load(self, data: Buffer) -> JsonObject:
        if data[:1] != b"\x01":
            raise ValueError("unknown jsonb binary format version")
        return JsonObject(bytes(data[1:]))


def register_lazy_json(context: AdaptContext) -> None:
    """Make `jsonb` columns read through `context` (a connection) load as `JsonObject`s, in
    either format."""
    context.adapters.register_loader("jsonb", LazyJsonLoader)
    context.adapters.register_loader("jsonb", LazyJsonBinaryLoader)
