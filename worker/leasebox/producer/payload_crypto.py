"""Encryption of message secrets (OTP codes, link tokens) at rest.

Secrets sit in the outbox until a worker sends them, so they are encrypted with
MultiFernet when `LEASEBOX_PAYLOAD_KEYS` is set: the first key encrypts, every key decrypts,
so keys rotate by adding a new key everywhere, then moving it to the front, then dropping
the old one once no row sealed with it is left. A tag prefix records which form a value is
in, so rows written before keys were configured remain readable.

Storing secrets fails closed: without keys, sealing is a `PayloadKeyError` unless plaintext
is allowed explicitly (`LEASEBOX_ALLOW_PLAINTEXT_SECRETS=1`, or `allow_plaintext=True`), for
development and the demo. A forgotten variable in production is then an error at the first
enqueue, not OTP codes in the clear in every backup.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from leasebox.errors import ConfigurationError, MissingPayloadKeys, PayloadKeyError

KEYS_VARIABLE = "LEASEBOX_PAYLOAD_KEYS"
PLAINTEXT_VARIABLE = "LEASEBOX_ALLOW_PLAINTEXT_SECRETS"
_PLAIN = b"p1:"
# Made once: `json.dumps` with arguments builds an encoder on every call.
_CANONICAL_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
_FERNET = b"f1:"


class PayloadCipher:
    """Seals and opens the `secrets` column.

    Without keys it opens plaintext values only, and seals only if `allow_plaintext`.
    """

    def __init__(self, keys: list[str] | None = None, *, allow_plaintext: bool = False) -> None:
        self._fernet: MultiFernet | None = None
        self.allow_plaintext = allow_plaintext
        self.key_count = len(keys or [])
        if keys:
            try:
                self._fernet = MultiFernet([Fernet(k.strip().encode()) for k in keys])
            except (ValueError, TypeError):
                raise PayloadKeyError(
                    f"{KEYS_VARIABLE} must be comma-separated Fernet keys "
                    "(32 url-safe base64-encoded bytes each)"
                ) from None

    @property
    def encrypts(self) -> bool:
        return self._fernet is not None

    @property
    def mode(self) -> str:
        """How secrets are handled, in words for logs and `/readyz` (never a key)."""
        if self._fernet is not None:
            plural = "s" if self.key_count != 1 else ""
            return f"encrypted ({self.key_count} key{plural})"
        if self.allow_plaintext:
            return f"plaintext allowed ({PLAINTEXT_VARIABLE}; development only)"
        return f"no keys ({KEYS_VARIABLE} unset: encrypted secrets cannot be opened)"

    def seal(self, secrets: Mapping[str, str]) -> bytes:
        raw = _CANONICAL_JSON.encode(dict(secrets)).encode()
        if self._fernet is None:
            if not self.allow_plaintext:
                raise PayloadKeyError(
                    f"refusing to store secrets unencrypted: set {KEYS_VARIABLE} (`leasebox "
                    f"keys generate` prints a key), or allow plaintext for development with "
                    f"{PLAINTEXT_VARIABLE}=1"
                )
            return _PLAIN + raw
        return _FERNET + self._fernet.encrypt(raw)

    def open(self, sealed: bytes) -> dict[str, str]:
        if sealed.startswith(_PLAIN):
            raw = sealed[len(_PLAIN) :]
        elif sealed.startswith(_FERNET):
            if self._fernet is None:
                raise MissingPayloadKeys(f"secrets are encrypted but {KEYS_VARIABLE} is not set")
            try:
                raw = self._fernet.decrypt(sealed[len(_FERNET) :])
            except InvalidToken:
                raise PayloadKeyError(
                    f"secrets cannot be decrypted with any key in {KEYS_VARIABLE}"
                ) from None
        else:
            raise PayloadKeyError("secrets column holds an unknown format")
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise PayloadKeyError("secrets column does not hold an object")
        return {str(k): str(v) for k, v in value.items()}


def keys_from_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return [k for k in env.get(KEYS_VARIABLE, "").split(",") if k.strip()]


def plaintext_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `LEASEBOX_ALLOW_PLAINTEXT_SECRETS` says yes; a value that is neither yes nor
    no is a `ConfigurationError` (a typo must not silently mean either)."""
    env = os.environ if environ is None else environ
    value = env.get(PLAINTEXT_VARIABLE, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{PLAINTEXT_VARIABLE} must be true or false")


@cache
def _cipher_for(keys: tuple[str, ...], allow_plaintext: bool) -> PayloadCipher:
    return PayloadCipher(list(keys), allow_plaintext=allow_plaintext)


def default_cipher() -> PayloadCipher:
    """The cipher configured by the environment (cached per configuration)."""
    return _cipher_for(tuple(keys_from_environment()), plaintext_allowed())


def generate_key() -> str:
    """A fresh key for `LEASEBOX_PAYLOAD_KEYS`."""
    return Fernet.generate_key().decode()
