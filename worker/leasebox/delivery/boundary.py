"""The one place where the runtime hears back from a provider, and makes what it hears safe.

A provider is remote code talking to a remote server: built-in, a mail-service module or a
third-party plugin, it may hand back anything. A message id with a NUL byte, an error text
with a lone surrogate or a megabyte-long id made the batched `mark_sent` fail, which stopped
the worker and made every restart send its batch again. So nothing a provider returns
reaches the database, a log line or a metric label unchecked:

- `send_once(provider, email)` calls `provider.send` and returns an `Accepted` or a
  `Failure`, never raises (except cancellation), for every provider alike;
- `accepted(result)` keeps a message id only if it is printable text of a sane length
  (characters that cannot be stored are replaced, an absurd id is dropped) and turns every
  flaw into a warning for the log;
- failures go through `retrying.classify`, which bounds the text and the code and reads a
  Retry-After only if it is a finite, positive number of seconds.

Whatever came back, the message was accepted or it was not: a flaw in the reply never turns
an acceptance into a failure (that would send it again).
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from leasebox.delivery.providers.base import (
    REPLACEMENT,
    Email,
    Provider,
    RequestOutcome,
    SendResult,
    one_line,
)
from leasebox.delivery.retrying import Failure, classify

# Longer than any provider's id format, far shorter than what a hostile reply could hold.
MAX_MESSAGE_ID_LENGTH = 255


class Accepted(NamedTuple):
    """The provider took the message; its id (if usable) and what was wrong with the reply."""

    provider_message_id: str | None
    warnings: tuple[str, ...] = ()
    outcome: str = RequestOutcome.ACCEPTED.value


async def send_once(provider: Provider, email: Email) -> Accepted | Failure:
    """One attempt through `provider`: what it said, made safe; only cancellation raises."""
    try:
        result = await provider.send(email)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # every failure is classified, whatever its type
        return classify(exc)
    return accepted(result)


def accepted(result: object) -> Accepted:
    """An acceptance from whatever `send` returned."""
    if not isinstance(result, SendResult):
        return Accepted(None, (f"the provider returned {type(result).__name__}, not a SendResult",))
    message_id, problem = usable_message_id(result.provider_message_id)
    warnings: tuple[str, ...] = (problem,) if problem else ()
    if result.warning:
        reported = one_line(str(result.warning)) or "the provider reported a problem"
        warnings = (reported, *warnings)
    return Accepted(message_id, warnings)


def usable_message_id(value: object) -> tuple[str | None, str | None]:
    """The id to store (or None) and, if the provider's id had to be changed, why."""
    if value is None:
        return None, None
    if (
        type(value) is str
        and 0 < len(value) <= MAX_MESSAGE_ID_LENGTH
        and value.isprintable()
        and value[0] != " "
        and value[-1] != " "
    ):
        # The usual id: kept as it is (printable text has no whitespace to strip but spaces).
        return value, None
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None, f"the provider's message id is a {type(value).__name__}, not text: dropped"
    text = str(value).strip()
    if not text:
        return None, None
    if len(text) > MAX_MESSAGE_ID_LENGTH:
        return None, (
            f"the provider's message id is {len(text)} characters long "
            f"(at most {MAX_MESSAGE_ID_LENGTH} are kept): dropped"
        )
    if text.isprintable():
        return text, None
    # Not printable: control characters (NUL among them), lone surrogates, separators.
    cleaned = "".join(c if c.isprintable() else REPLACEMENT for c in text)
    if cleaned != text:
        return cleaned, "the provider's message id held unprintable characters: replaced"
    return text, None
