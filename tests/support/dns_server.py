"""A DNS server on loopback that answers from a table, for the domain policy's MX check.

Built from dnspython's own message parsing and writing, on a UDP socket in a thread (the
sync resolver blocks the caller, the async one runs in the test's loop: both ask it over the
wire). A name not in the table is NXDOMAIN; a name in `silent` gets no answer at all, so a
lookup of it runs into the resolver's timeout.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


@dataclass
class Zone:
    """Records by name and type (`{"mail.test.": {"MX": ["10 mx.mail.test."]}}`)."""

    records: Mapping[str, Mapping[str, list[str]]]
    silent: frozenset[str] = frozenset()
    asked: list[str] = field(default_factory=list)

    def answer(self, wire: bytes) -> bytes | None:
        query = dns.message.from_wire(wire)
        question = query.question[0]
        name = question.name.to_text().lower()
        kind = dns.rdatatype.to_text(question.rdtype)
        self.asked.append(f"{name} {kind}")
        if name in self.silent:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
        else:
            values = self.records[name].get(kind, [])
            if values:
                response.answer.append(
                    dns.rrset.from_text_list(name, 300, dns.rdataclass.IN, kind, values)
                )
        return response.to_wire()


@contextmanager
def dns_server(zone: Zone) -> Iterator[int]:
    """Serve `zone` on 127.0.0.1 for the body of the block; yields the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                wire, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            reply = zone.answer(wire)
            if reply is not None:
                sock.sendto(reply, peer)

    thread = threading.Thread(target=serve, name="test dns", daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()
