"""Providers that deliver nowhere: `log://` for development and demos, `null://` for benchmarks.

`log://` shows that a message *would* have gone out, one line per send, with only what a log
may hold: outbox id, kind, delivery key and the recipient's domain; never the body, the
subject or the code. `null://` accepts at once (or after `?delay=` seconds, to model a slow
provider) so that a benchmark measures leasebox rather than a mail server. Both return a
message id made from the delivery key, so a repeated send reports the same id.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from leasebox.delivery.providers.base import Email, SendResult, derived_message_id
from leasebox.delivery.providers.urls import UrlOption, option_names, parse_provider_url
from leasebox.errors import ConfigurationError

LOG_OPTIONS = (UrlOption("stream", "`stdout`", "`stdout` or `stderr`: where each line goes"),)
NULL_OPTIONS = (
    UrlOption("delay", "`0`", "seconds each send takes, to stand in for a provider's latency"),
)


def log_line(email: Email, message_id: str) -> str:
    """The one redacted line `log://` prints for a send."""
    return (
        f"leasebox log provider: accepted outbox_id={email.outbox_id} kind={email.kind} "
        f"delivery_key={email.delivery_key} to=*@{email.recipient_domain} "
        f"attempt={email.attempt} message_id={message_id}"
    )


class LogProvider:
    """Prints one redacted line per send to stdout (or stderr) and accepts every message."""

    name = "log"

    def __init__(self, stream: TextIO | None = None, *, use_stderr: bool = False) -> None:
        self._stream = stream
        self._use_stderr = use_stderr

    def __repr__(self) -> str:
        return f"LogProvider(stream={'stderr' if self._use_stderr else 'stdout'})"

    async def start(self) -> None:
        return None

    async def send(self, email: Email) -> SendResult:
        message_id = derived_message_id(email.delivery_key, domain="log.leasebox")
        # Looked up per send, so that a redirected sys.stdout is honoured.
        stream = self._stream or (sys.stderr if self._use_stderr else sys.stdout)
        print(log_line(email, message_id), file=stream, flush=True)
        return SendResult(provider_message_id=message_id)

    async def check(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


class NullProvider:
    """Accepts every message without doing anything, optionally after a fixed delay.

    It never reads a message, so the worker does not render or decrypt for it: null://
    measures the outbox machinery alone (claims, completions, metrics). Its message id is
    the delivery key itself (`null:<key>`): the same on every repeat, and nothing is sent
    anywhere for a hash to keep the key out of.
    """

    name = "null"
    reads_content = False

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.sent = 0

    def __repr__(self) -> str:
        return f"NullProvider(delay={self.delay:g})"

    async def start(self) -> None:
        return None

    async def send(self, email: Email) -> SendResult:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.sent += 1
        return SendResult("null:" + email.delivery_key)

    async def check(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


def development_provider_from_url(url: str, timeout: float) -> LogProvider | NullProvider:
    """The `log://` / `null://` factory used by `provider_from_url`; `timeout` is unused."""
    parsed = parse_provider_url(url)
    if parsed.host or parsed.path not in ("", "/") or parsed.username or parsed.password:
        raise ConfigurationError(
            f"{parsed.scheme}:// provider URL takes no host, path or credentials, "
            f"only options, e.g. {parsed.scheme}://?"
            + ("stream=stderr" if parsed.scheme == "log" else "delay=0.05")
        )
    if parsed.scheme == "log":
        parsed.reject_unknown_options(option_names(LOG_OPTIONS))
        stream = parsed.options.get("stream", "stdout").lower()
        if stream not in ("stdout", "stderr"):
            raise ConfigurationError("log:// provider URL option 'stream' must be stdout or stderr")
        return LogProvider(use_stderr=stream == "stderr")
    if parsed.scheme == "null":
        parsed.reject_unknown_options(option_names(NULL_OPTIONS))
        return NullProvider(delay=parsed.float_option("delay", 0.0) if parsed.options else 0.0)
    raise ConfigurationError(f"{parsed.scheme}:// is not a development provider")
