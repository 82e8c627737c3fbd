"""Greylisting for the private Postfix: a policy service over Postfix's delegation protocol.

Postfix asks `check_policy_service inet:127.0.0.1:PORT` at RCPT with a request of
`name=value` lines ended by an empty line, and waits for `action=...` and an empty line
(https://www.postfix.org/SMTPD_POLICY_README.html). Greylisting answers the first request of
a (client address, sender, recipient) triple with a 450, as a real greylisting service does
on first contact, and lets the same triple through from then on. Real services also wait a
few minutes before they accept the retry; here the retry is accepted at once, so that a
test needs no clock. The service runs in threads of the test process (one connection per
smtpd process, kept open between requests).
"""

from __future__ import annotations

import socketserver
import threading
from collections import Counter

from leasebox.testing.ports import free_port

GREYLISTED = "450 4.7.1 Greylisted: first contact, try again later"

Triple = tuple[str, str, str]


class Greylist:
    """The triples seen so far and what each request was answered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[Triple] = set()
        self.answers: Counter[tuple[Triple, str]] = Counter()

    def decide(self, request: dict[str, str]) -> str:
        """The action for one request: a 450 the first time its triple is seen, else DUNNO."""
        triple = (
            request.get("client_address", ""),
            request.get("sender", ""),
            request.get("recipient", ""),
        )
        with self._lock:
            first = triple not in self._seen
            self._seen.add(triple)
            action = GREYLISTED if first else "DUNNO"
            self.answers[triple, action] += 1
        return action

    def deferred(self, recipient: str) -> int:
        """How many requests for `recipient` were answered with the 450."""
        with self._lock:
            return sum(
                n for (t, a), n in self.answers.items() if t[2] == recipient and a != "DUNNO"
            )


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        request: dict[str, str] = {}
        for raw in self.rfile:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line:
                name, _, value = line.partition("=")
                request[name] = value
                continue
            action = self.server.greylist.decide(request)
            self.wfile.write(f"action={action}\n\n".encode())
            self.wfile.flush()
            request = {}


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, greylist: Greylist) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.greylist = greylist


class PolicyService:
    """The greylisting service on a free loopback port, served until `stop`."""

    def __init__(self) -> None:
        self.greylist = Greylist()
        self._server = _Server(free_port(), self.greylist)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="postfix-policy", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
