"""What every receiver checks before it believes a request: its size, its age, its signature.

A request is an `Inbound` (lower-case headers, the raw body, the receiver's clock); a check
that fails raises `Refused` with the HTTP status to answer and a short reason code (a metric
label and the answer's body, never anything the request carried). Signatures are compared
in constant time, and every service takes several secrets at once, so that a key rotates
without a gap: the new one is added, the service switched, the old one removed.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

# The window a signed timestamp must fall in, either side of the receiver's clock.
DEFAULT_TOLERANCE_SECONDS = 300.0


class Refused(Exception):
    """The request is refused: answer `status` with `reason`, store nothing."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Inbound:
    """A request as a receiver sees it: headers by lower-case name, the body as sent."""

    headers: Mapping[str, str]
    body: bytes
    now: datetime

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "").strip()


def unsigned() -> Refused:
    return Refused(401, "missing_signature")


def forged() -> Refused:
    return Refused(403, "bad_signature")


def signed_time(text: str, now: datetime, tolerance_seconds: float) -> datetime:
    """The Unix time `text`, if it is within the tolerance of `now`; else `Refused` (stale)."""
    try:
        moment = datetime.fromtimestamp(float(text), UTC)
    except (ValueError, OverflowError, OSError):
        raise Refused(400, "bad_timestamp") from None
    if abs((now - moment).total_seconds()) > tolerance_seconds:
        raise Refused(400, "stale")
    return moment


def any_equal(expected: list[bytes], given: list[bytes]) -> bool:
    """Whether any given value equals any expected one, each compared in constant time."""
    found = False
    for want in expected:
        for have in given:
            found |= hmac.compare_digest(want, have)
    return found
