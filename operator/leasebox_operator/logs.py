"""The operator's logs in the worker's JSON schema, kopf's records included.

With `--log-format json` every line, from kopf or from leasebox, is one object of the
schema `leasebox.runtime.logs.JsonFormatter` writes for the worker (`time`, `level`, `logger`,
`message`, then the context fields), so one log pipeline parses both. kopf's per-object
records carry the resource as `k8s_ref`; it becomes `object` (apiVersion, kind,
namespace, name, uid), and kopf's internal `settings` and `k8s_skip` are left out. The
text formats stay kopf's own.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import kopf

from leasebox.runtime.logs import JsonFormatter

_KOPF_INTERNALS = ("settings", "k8s_skip", "k8s_ref")


class OperatorJsonFormatter(JsonFormatter):
    """`JsonFormatter` with kopf's object reference as `object`."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in record.__dict__.items() if k not in _KOPF_INTERNALS}
        copy = logging.makeLogRecord(fields)
        ref = getattr(record, "k8s_ref", None)
        if ref:
            copy.object = dict(ref)
        return super().format(copy)


class _OperatorHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler this module installed (so a second configure replaces it)."""


def configure_logging(log_format: str, *, verbose: bool, stream: TextIO | None = None) -> None:
    """Log the operator (kopf and leasebox) in `log_format`: json, plain or full."""
    if log_format != "json":
        formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL}
        kopf.configure(verbose=verbose, log_format=formats[log_format])
        return
    handler = _OperatorHandler(stream or sys.stderr)
    handler.setFormatter(OperatorJsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _OperatorHandler)]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    quiet = logging.getLogger("asyncio")
    quiet.propagate = verbose
