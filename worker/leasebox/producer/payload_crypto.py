"""Encryption of message secrets (OTP codes, link tokens) at rest.

Secrets sit in the outbox until a worker sends them, so they are encrypted with
MultiFernet when `LEASEBOX_PAYLOAD_KEYS` is set: the first key encrypts, every key decrypts,
so keys rotate by prepending a new one. A one-byte-tag prefix records which form a value is
in, so rows written before keys were configured remain readable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from leasebox.errors import PayloadKeyError

KEYS_VARIABLE = "LEASEBOX_PAYLOAD_KEYS"
_PLAIN = b"p1:"
_FERNET = b"f1:"


class PayloadCipher:
    """Seals and opens the `secrets` column."""

    def __init__(self, keys: list[str] | None = None) -> None:
        self._fernet: MultiFernet | None = None
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

    def seal(self, secrets: Mapping[str, str]) -> bytes:
        raw = json.dumps(dict(secrets), separators=(",", ":"), sort_keys=True).encode()
        if self._fernet is None:
            return _PLAIN + raw
        return _FERNET + self._fernet.encrypt(raw)

    def open(self, sealed: bytes) -> dict[str, str]:
        if sealed.startswith(_PLAIN):
            raw = sealed[len(_PLAIN) :]
        elif sealed.startswith(_FERNET):
            if self._fernet is None:
                raise PayloadKeyError(f"secrets are encrypted but {KEYS_VARIABLE} is not set")
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


@cache
def _cipher_for(keys: tuple[str, ...]) -> PayloadCipher:
    return PayloadCipher(list(keys))


def default_cipher() -> PayloadCipher:
    """The cipher configured by the environment (cached per key set)."""
    return _cipher_for(tuple(keys_from_environment()))


def generate_key() -> str:
    """A fresh key for `LEASEBOX_PAYLOAD_KEYS`."""
    return Fernet.generate_key().decode()
