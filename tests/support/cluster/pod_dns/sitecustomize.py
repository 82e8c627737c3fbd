"""Cluster DNS for the test node's pods: `NAME.NAMESPACE.svc` resolves to a ready pod.

Loaded by Python at start-up in every process the test kubelet runs (it is on the pod's
PYTHONPATH and nowhere else). Names the kubelet's Service table lists resolve to
127.0.0.1 and the host port that serves the Service's port; every other name resolves as
before.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

_TABLE = os.environ.get("LEASEBOX_TEST_SERVICES", "")
_resolve = socket.getaddrinfo


def _getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else str(host or "")
    if _TABLE and (name.endswith(".svc") or ".svc." in name or name.count(".") == 1):
        try:
            with open(_TABLE, encoding="utf-8") as table:
                ports = json.load(table).get(name.rstrip("."))
        except (OSError, ValueError):
            ports = None
        if ports is not None:
            mapped = ports.get(str(port))
            if mapped is None:
                raise socket.gaierror(socket.EAI_NONAME, f"service {name} has no port {port}")
            return _resolve("127.0.0.1", mapped, *args, **kwargs)
    return _resolve(host, port, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
