"""Structured logs for the worker: JSON lines in production, readable text at a terminal.

Log calls pass their context as `extra` fields (`outbox_id`, `aggregate_id`, `kind`,
`attempt`, `error_class`, `provider_message_id`, ...), which the JSON formatter emits as keys
and the text formatter appends as `key=value`. Neither formatter prints anything the caller
did not put there, and the worker never puts a recipient's message, a secret or an OTP code
there. As a second line of defence, `configure_logging` masks the values it is told are
secret (the DSN password, provider credentials) in every formatted line.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from leasebox.store.claiming import ClaimedMessage

LOGGER_NAME = "leasebox"
FORMATS = ("json", "text")
# Libraries whose warnings belong in the same stream and format (pool reconnects, server errors).
LIBRARY_LOGGERS = ("psycopg", "aiohttp")

# The attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and v is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        if not extra:
            return line
        head, newline, tail = line.partition("\n")
        return f"{head} {extra}{newline}{tail}"


class _Masking(logging.Formatter):
    """Wraps a formatter and replaces known secret values in its output."""

    def __init__(self, inner: logging.Formatter, secrets: Iterable[str]) -> None:
        super().__init__()
        self._inner = inner
        self._secrets = sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        text = self._inner.format(record)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def fatal_line(command: str, exc: BaseException, *, with_traceback: bool = False) -> str:
    """The one JSON line a command ends with on a fatal error (the schema of every line)."""
    record = logging.LogRecord(LOGGER_NAME, logging.CRITICAL, "", 0, str(exc), None, None)
    record.command = command
    record.error = type(exc).__name__
    record.exit_code = getattr(exc, "exit_code", 1)
    if with_traceback:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    return JsonFormatter().format(record)


def default_format(stream: TextIO) -> str:
    """`text` when writing to a terminal, `json` otherwise (containers, files, pipes)."""
    return "text" if stream.isatty() else "json"


def configure_logging(
    log_format: str,
    level: str | int = "INFO",
    *,
    stream: TextIO | None = None,
    mask: Iterable[str] = (),
) -> logging.Handler:
    """Send the `leasebox` loggers' records to `stream` (stderr) in `log_format`.

    Returns the handler so that a caller embedding the worker can remove it again.
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    formatter: logging.Formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Masking(formatter, mask))
    handler._leasebox = True  # type: ignore[attr-defined]
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    for name in (LOGGER_NAME, *LIBRARY_LOGGERS):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            if getattr(old, "_leasebox", False):
                logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(numeric if name == LOGGER_NAME else max(numeric, logging.WARNING))
        logger.propagate = False
    return handler


def remove_logging(handler: logging.Handler) -> None:
    """Undo `configure_logging` (for embedding and tests)."""
    for name in (LOGGER_NAME, *LIBRARY_LOGGERS):
        logging.getLogger(name).removeHandler(handler)


def message_fields(message: ClaimedMessage) -> dict[str, object]:
    """The log fields that identify a message (never its recipient or content)."""
    return {
        "outbox_id": message.id,
        "aggregate_id": message.aggregate_id,
        "kind": message.kind,
        "attempt": message.attempts,
    }
