"""Free TCP ports on loopback for the servers the demo, the tests and the benchmarks start.

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the range every
outgoing connection draws its local port from too: between the probe socket closing and
the server binding the port, any connection of any process (to PostgreSQL, to a stand-in)
may take it. With several test processes connecting all the time that happens, and the
server fails with "address already in use". Below the ephemeral range only listeners
compete, so a port is drawn at random from there and probed with a bind; the kernel's
choice is the fallback when the range leaves no room below it.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_EPHEMERAL_FLOOR = 32768
_SPAN = 12000
_LOWEST = 1024
_TRIES = 64


def _ephemeral_floor() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LINUX_EPHEMERAL_FLOOR


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, below the ephemeral range
    when there is room there."""
    top = min(_ephemeral_floor(), _LINUX_EPHEMERAL_FLOOR)
    low = max(_LOWEST, top - _SPAN)
    if top - low >= _SPAN // 4:
        for _ in range(_TRIES):
            port = low + secrets.randbelow(top - low)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
