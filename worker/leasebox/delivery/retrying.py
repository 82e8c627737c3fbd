"""What to do after a failed send: how long to wait, and whether to try again at all.

This is the pure half of the worker's failure handling, kept apart from I/O so that the
backoff curve and the classification table are tested exhaustively without a database or a
provider. The runtime asks two questions per failure: `classify(exc)` (retry, or dead letter
with which reason?) and `backoff_delay(attempt, ...)` (how long until the row is ready again?).
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from leasebox.delivery.providers.base import RequestOutcome, one_line, request_outcome
from leasebox.errors import PERMANENT, TRANSIENT, PayloadKeyError, ProviderError, UnreadableData
from leasebox.states import DeadReason


@dataclass(frozen=True)
class Failure:
    """A classified failure: `permanence` is `transient` or `permanent`.

    `code` is short and low-cardinality (`smtp_550`, `timeout`, `template`): it becomes the
    `error_class` label of the retry metric and the `last_error_class` column. `detail` is one
    bounded line that is safe to log and store: never a body, a secret or a password.
    """

    permanence: str
    code: str
    detail: str
    retry_after: float | None = None
    outcome: str = RequestOutcome.ERROR.value
    """What the provider request amounted to (the provider metrics' `outcome` label)."""

    @property
    def transient(self) -> bool:
        return self.permanence == TRANSIENT

    @property
    def suppressed_by_provider(self) -> bool:
        """Whether the provider refused the address as one it suppresses (Postmark's 406,
        an inactive recipient): the message ends `suppressed`, the mailbox goes on the list."""
        return self.code in PROVIDER_SUPPRESSION_CODES

    @property
    def dead_reason(self) -> DeadReason:
        """The dead-letter reason if this failure ends the message now."""
        if self.code == EXPIRED_CODE:
            return DeadReason.EXPIRED
        if self.code in _INVALID_MESSAGE_CODES:
            return DeadReason.INVALID_MESSAGE
        return DeadReason.REJECTED


# A message whose outbox row is gone (removed by hand) has nothing to send, ever.
MISSING_MESSAGE_CODE = "missing_message"
_INVALID_MESSAGE_CODES = frozenset({"template", "invalid_data", MISSING_MESSAGE_CODE})
EXPIRED_CODE = "expired"
# The provider may have taken the message (`AmbiguousProviderError`, a send cut short).
AMBIGUOUS_CODE = "ambiguous"
TIMEOUT_CODE = "timeout"
# The codes of a provider's refusal of an address it suppresses (hard-bounced, complained,
# unsubscribed, deactivated) at the time of the send. SES, SendGrid, Mailgun and Resend accept
# such a message and say so in their events instead (`leasebox.feedback`).
PROVIDER_SUPPRESSION_CODES = frozenset({"postmark_406"})
# A code becomes a metric label and a column: short, lower-case, from a small alphabet.
MAX_CODE_LENGTH = 40
_CODE_CHARACTERS = re.compile(r"[^a-z0-9_]+")
# The longest wait a provider's Retry-After can impose on one attempt.
MAX_RETRY_AFTER = 3600.0


def classify(exc: BaseException) -> Failure:
    """Map an exception raised while preparing or sending a message to a `Failure`.

    | exception                               | permanence | code                     |
    |-----------------------------------------|------------|--------------------------|
    | `ProviderError`                         | its own    | its own (`smtp_550`, ..) |
    | template error (missing, undefined)     | permanent  | `template`               |
    | `UnreadableData` (data nested too deep) | permanent  | `invalid_data`           |
    | `PayloadKeyError` (secrets unreadable)  | transient  | `payload_keys`           |
    | `TimeoutError`                          | transient  | `timeout`                |
    | `ConnectionError`, other `OSError`      | transient  | `connection`             |
    | anything else                           | transient  | `unexpected`             |

    Unreadable secrets are transient on purpose: during a key rotation one worker may lack
    the new key, and the attempt limit still ends a message that never decrypts.
    Unknown exceptions are transient for the same reason: a bug in one worker version must
    not dead-letter every message it touches; the attempt limit bounds the damage.
    Messages of unknown exceptions are not kept: they may quote anything. A `ProviderError`
    may come from any plugin, so its class, code, text and Retry-After are each checked:
    the code is reduced to a bounded label, the text to one bounded storable line, an
    unknown `permanence` counts as transient and a Retry-After that is not a finite
    positive number is ignored.
    """
    if isinstance(exc, ProviderError):
        code = failure_code(getattr(exc, "code", None))
        detail = one_line(_text_of(exc)) or code
        permanence = PERMANENT if exc.permanence == PERMANENT else TRANSIENT
        retry_after = _seconds(getattr(exc, "retry_after", None))
        return Failure(permanence, code, detail, retry_after, request_outcome(exc).value)
    if isinstance(exc, UnreadableData):
        return Failure(PERMANENT, "invalid_data", one_line(str(exc)))
    if _is_template_error(exc):
        return Failure(PERMANENT, "template", one_line(str(exc)) or "template error")
    if isinstance(exc, PayloadKeyError):
        return Failure(TRANSIENT, "payload_keys", one_line(str(exc)))
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return Failure(
            TRANSIENT, TIMEOUT_CODE, "the send timed out", outcome=RequestOutcome.TIMEOUT.value
        )
    if isinstance(exc, ConnectionError | OSError):
        detail = f"connection failed ({type(exc).__name__})"
        return Failure(TRANSIENT, "connection", detail, outcome=RequestOutcome.CONNECTION.value)
    return Failure(TRANSIENT, "unexpected", f"unexpected {type(exc).__name__}")


def failure_code(value: object) -> str:
    """A provider's error code as a safe, low-cardinality label (`provider_error` if none)."""
    text = value if isinstance(value, str) else ""
    label = _CODE_CHARACTERS.sub("_", text.lower()).strip("_")[:MAX_CODE_LENGTH].strip("_")
    return label or "provider_error"


def _text_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a plugin's __str__ may fail like anything else it does
        return ""


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _is_template_error(exc: BaseException) -> bool:
    # Imported lazily: rendering pulls in Jinja2, which the pure tests need not load.
    from leasebox.errors import TemplateError

    return isinstance(exc, TemplateError)


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after failed attempt number `attempt` (1 for the first).

    The ceiling is `min(cap, base * 2**(attempt-1))`; the delay is drawn uniformly from its
    upper half ("equal jitter"), so retries of a burst spread out yet never come back sooner
    than half the nominal delay. `rng` returns a float in [0, 1) and is injected by tests.
    """
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    exponent = min(attempt - 1, 62)  # 2**62 * base overflows nothing and exceeds any cap
    ceiling = min(cap, base * float(2**exponent))
    return ceiling / 2 + ceiling / 2 * rng()


def retry_delay(
    failure: Failure,
    attempt: int,
    *,
    base: float,
    cap: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """The delay before the next attempt: the backoff, or longer if the provider asked.

    A provider's `Retry-After` wins over a shorter backoff (retrying sooner only spends an
    attempt on another refusal), bounded by `MAX_RETRY_AFTER` so that a bogus header cannot
    park a message for days.
    """
    delay = backoff_delay(attempt, base=base, cap=cap, rng=rng)
    if failure.retry_after is not None and failure.retry_after > delay:
        return min(failure.retry_after, MAX_RETRY_AFTER)
    return delay


def should_retry(failure: Failure, attempts: int, max_attempts: int) -> bool:
    """A transient failure is retried while the message has attempts left."""
    return failure.transient and attempts < max_attempts
