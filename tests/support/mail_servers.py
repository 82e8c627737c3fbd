"""A real SMTP server on loopback for the provider tests, with scripted replies.

aiosmtpd's `Controller` runs the server in its own thread and event loop. It cannot bind port
0 (it connects to its own port to check readiness), so a free port is picked first. Replies
are scripted by the recipient's local part, so one server serves every failure case:
`reject550@...` and `reject553@...` are refused at RCPT, `defer451@...` deferred there,
`shutdown421@...` and `spam554@...` get that reply to DATA, `slow@...` waits before answering
DATA, and a sender `bounce553@...` is refused at MAIL. A refused login is answered the way a
careless server does it: the 535 quotes the user and password back.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from leasebox.testing.ports import free_port

SMTP_USER = "leasebox"
SMTP_PASSWORD = "correct-horse-battery"  # the password the test server accepts


@dataclass
class Delivered:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    session_id: int  # numbered by the handler: `id()` of a session may be reused once it ends
    mail_options: list[str] = field(default_factory=list)
    octets: int = 0  # the message's size as received, CRLF line ends included


@dataclass
class RecordingHandler:
    """Stores every accepted message and answers by the recipient's local part."""

    delivered: list[Delivered] = field(default_factory=list)
    drop_after_data: bool = False
    slow_seconds: float = 1.0
    senders: list[str] = field(default_factory=list)  # every MAIL FROM, accepted or not
    recipients: list[str] = field(default_factory=list)  # every RCPT TO, accepted or not
    sessions: int = 0

    def session_number(self, session: Any) -> int:
        """The number of `session` among the sessions this handler has seen (from 1)."""
        number = getattr(session, "leasebox_number", None)
        if number is None:
            self.sessions += 1
            number = session.leasebox_number = self.sessions
        return int(number)

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        self.senders.append(address)
        if address.startswith("bounce553@"):
            return "553 5.1.8 <bounce553@example.com>: sender address rejected"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        self.recipients.append(address)
        local = address.partition("@")[0]
        if local == "reject550":
            return f"550 5.1.1 <{address}>: Recipient address rejected: user unknown"
        if local == "reject553":
            return f"553 5.1.3 <{address}>: mailbox name not allowed"
        if local == "defer451":
            return "451 4.7.1 Greylisted, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        local = envelope.rcpt_tos[0].partition("@")[0]
        if local == "shutdown421":
            return "421 4.3.2 Service shutting down"
        if local == "spam554":
            return "554 5.7.1 Message rejected as spam"
        if local == "slow":
            await asyncio.sleep(self.slow_seconds)
        parsed = message_from_bytes(envelope.original_content, policy=policy.default)
        assert isinstance(parsed, EmailMessage)
        self.delivered.append(
            Delivered(
                envelope.mail_from,
                list(envelope.rcpt_tos),
                parsed,
                self.session_number(session),
                list(envelope.mail_options),
                len(envelope.original_content),
            )
        )
        if self.drop_after_data:
            asyncio.get_running_loop().call_soon(server.transport.close)
        return "250 2.0.0 OK queued"


def authenticator(
    server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
) -> AuthResult:
    ok = (
        isinstance(auth_data, LoginPassword)
        and auth_data.login == SMTP_USER.encode()
        and auth_data.password == SMTP_PASSWORD.encode()
    )
    if ok or not isinstance(auth_data, LoginPassword):
        # handled=False makes the server answer itself; True would leave the client waiting.
        return AuthResult(success=ok, handled=False)
    # A careless server: its refusal quotes the credentials back, which the provider masks.
    quoted = f"{auth_data.login.decode()}:{auth_data.password.decode()}"
    return AuthResult(
        success=False, handled=False, message=f"535 5.7.8 Authentication failed for {quoted}"
    )


@dataclass
class SmtpServer:
    port: int
    handler: RecordingHandler

    def url(self, query: str = "", *, scheme: str = "smtp", userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{at}127.0.0.1:{self.port}{'?' + query if query else ''}"


class _TrackedSMTP(SMTP):
    """aiosmtpd's server protocol, remembering its open transports."""

    def __init__(self, open_transports: set[asyncio.BaseTransport], *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self._open_transports = open_transports

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._open_transports.add(transport)


class _ClosingController(Controller):
    """Closes the server side of every connection before stopping.

    `Controller.stop` cancels the sessions but leaves their sockets to the garbage collector,
    which a client that just hung up (EOF not yet read by the server thread) would trip as a
    ResourceWarning, an error under this suite's warning filter.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_transports: set[asyncio.BaseTransport] = set()

    def factory(self) -> SMTP:
        return _TrackedSMTP(self.open_transports, self.handler, **self.SMTP_kwargs)

    async def _close_sessions(self) -> None:
        for transport in list(self.open_transports):
            transport.close()
        for _ in range(3):  # let connection_lost run for each closed transport
            await asyncio.sleep(0)

    def stop(self, no_assert: bool = False) -> None:
        asyncio.run_coroutine_threadsafe(self._close_sessions(), self.loop).result(timeout=5)
        super().stop(no_assert)


def serve(handler: RecordingHandler, **kwargs: Any) -> Iterator[SmtpServer]:
    port = free_port()
    controller = _ClosingController(handler, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield SmtpServer(port=port, handler=handler)
    finally:
        controller.stop()


def self_signed_context(directory: Path) -> ssl.SSLContext:
    """A server TLS context with a throwaway self-signed certificate for 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(IPv4Address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context
