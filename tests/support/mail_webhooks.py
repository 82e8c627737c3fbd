"""The five mail services' webhooks as the services send them, signed with keys made here.

Each `Signer` builds a request the way its service documents it (headers, body, signature)
for an event leasebox cares about, with an `at` time and an event id of its own, so a test
can send the same event forty times under new ids, replay a request byte for byte, sign
with the wrong key or too long ago. For SES the signing certificate is one this module makes
under a CA of its own and serves from a loopback HTTPS server (`SnsCertificateServer`),
which also answers subscription confirmations and records every request it gets; the
receiver is told to trust that CA and that host instead of Amazon's.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from leasebox.feedback.certificates import SigningCertificates
from leasebox.testing.ports import free_port

Request = tuple[dict[str, str], bytes]
TOPIC = "arn:aws:sns:eu-west-1:123456789012:ses-events"


def unix(at: dt.datetime) -> str:
    return str(int(at.timestamp()))


@dataclass
class SendGridSigner:
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )

    @property
    def public_key(self) -> str:
        der = self.key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return base64.b64encode(der).decode()

    def sign(self, body: bytes, timestamp: str) -> dict[str, str]:
        signature = self.key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        return {
            "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
            "X-Twilio-Email-Event-Webhook-Timestamp": timestamp,
            "Content-Type": "application/json",
        }

    def request(self, events: list[dict[str, Any]], at: dt.datetime) -> Request:
        body = json.dumps(events).encode()
        return self.sign(body, unix(at)), body

    @staticmethod
    def event(kind: str, message_id: str, to: str, at: dt.datetime, **extra: Any) -> dict[str, Any]:
        return {
            "email": to,
            "timestamp": int(at.timestamp()),
            "event": kind,
            "sg_event_id": uuid.uuid4().hex,
            "sg_message_id": f"{message_id}.filterdrecv-5bd6f4d9c4-2xtq5-1-0",
            **extra,
        }


@dataclass
class PostmarkCredentials:
    user: str = "hooks"
    password: str = "s3cret-pass"

    def request(self, record: dict[str, Any], *, user: str | None = None) -> Request:
        token = base64.b64encode(f"{user or self.user}:{self.password}".encode()).decode()
        headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        return headers, json.dumps(record).encode()

    @staticmethod
    def bounce(
        message_id: str, to: str, at: dt.datetime, kind: str = "HardBounce"
    ) -> dict[str, Any]:
        return {
            "RecordType": "Bounce",
            "ID": uuid.uuid4().int % 10**10,
            "Type": kind,
            "TypeCode": 1,
            "MessageID": message_id,
            "Email": to,
            "From": "no-reply@mail.example.com",
            "BouncedAt": at.isoformat(),
            "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist",
            "Inactive": True,
        }


@dataclass
class MailgunSigner:
    key: str = field(default_factory=lambda: uuid.uuid4().hex)

    def request(
        self, event: dict[str, Any], at: dt.datetime, *, token: str | None = None
    ) -> Request:
        timestamp, token = unix(at), token or uuid.uuid4().hex
        digest = hmac.new(self.key.encode(), (timestamp + token).encode(), hashlib.sha256)
        body = {
            "signature": {"timestamp": timestamp, "token": token, "signature": digest.hexdigest()},
            "event-data": event,
        }
        return {"Content-Type": "application/json"}, json.dumps(body).encode()

    @staticmethod
    def failed(
        message_id: str, to: str, at: dt.datetime, severity: str = "permanent"
    ) -> dict[str, Any]:
        return {
            "id": uuid.uuid4().hex,
            "event": "failed",
            "severity": severity,
            "reason": "bounce" if severity == "permanent" else "generic",
            "recipient": to,
            "timestamp": at.timestamp(),
            "envelope": {"sender": "bounce@mg.example.com"},
            "message": {"headers": {"message-id": message_id.strip("<>")}},
            "delivery-status": {
                "code": 550 if severity == "permanent" else 452,
                "message": "5.1.1 No such user" if severity == "permanent" else "4.2.2 Full",
            },
        }


@dataclass
class ResendSigner:
    secret: str = field(
        default_factory=lambda: "whsec_" + base64.b64encode(uuid.uuid4().bytes * 2).decode()
    )

    def sign(self, body: bytes, at: dt.datetime, message_id: str) -> dict[str, str]:
        key = base64.b64decode(self.secret.removeprefix("whsec_"))
        content = f"{message_id}.{unix(at)}.".encode() + body
        signature = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
        return {
            "svix-id": message_id,
            "svix-timestamp": unix(at),
            "svix-signature": f"v1,{signature}",
            "Content-Type": "application/json",
        }

    def request(
        self, event: dict[str, Any], at: dt.datetime, *, svix_id: str | None = None
    ) -> Request:
        body = json.dumps(event).encode()
        return self.sign(body, at, svix_id or f"msg_{uuid.uuid4().hex}"), body

    @staticmethod
    def event(kind: str, email_id: str, to: str, at: dt.datetime, **data: Any) -> dict[str, Any]:
        return {
            "type": kind,
            "created_at": at.isoformat().replace("+00:00", "Z"),
            "data": {
                "email_id": email_id,
                "from": "Acme <no-reply@mail.example.com>",
                "to": [to],
                "created_at": at.isoformat(),
                **data,
            },
        }


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


@dataclass
class Pki:
    """A CA, a TLS certificate for 127.0.0.1 and an SNS signing certificate, all made here."""

    directory: Path
    ca_key: rsa.RSAPrivateKey = field(init=False)
    ca: x509.Certificate = field(init=False)
    signing_key: rsa.RSAPrivateKey = field(init=False)
    signing_pem: bytes = field(init=False)

    def __post_init__(self) -> None:
        now = dt.datetime.now(dt.UTC)
        self.ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ca = (
            x509.CertificateBuilder()
            .subject_name(_name("test sns ca"))
            .issuer_name(_name("test sns ca"))
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.signing_pem = self._issue(self.signing_key, "sns.amazonaws.com").public_bytes(
            serialization.Encoding.PEM
        )
        tls_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        tls = self._issue(tls_key, "127.0.0.1", ip=True)
        (self.directory / "tls.pem").write_bytes(tls.public_bytes(serialization.Encoding.PEM))
        (self.directory / "tls.key").write_bytes(
            tls_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def _issue(self, key: rsa.RSAPrivateKey, common: str, *, ip: bool = False) -> x509.Certificate:
        import ipaddress

        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common))
            .issuer_name(self.ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=2))
        )
        if ip:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(common))]),
                critical=False,
            )
        return builder.sign(self.ca_key, hashes.SHA256())

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        context.load_verify_locations(
            cadata=self.ca.public_bytes(serialization.Encoding.PEM).decode()
        )
        return context

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.directory / "tls.pem", self.directory / "tls.key")
        return context


@dataclass
class SnsCertificateServer:
    """The loopback stand-in for `sns.<region>.amazonaws.com`: the certificate, a
    subscription endpoint, a redirect; `requests` lists the paths asked for."""

    pki: Pki
    host: str = ""
    requests: list[str] = field(default_factory=list)

    def certificates(self) -> SigningCertificates:
        return SigningCertificates(
            host_for_region=lambda region: self.host, ssl_context=self.pki.client_context()
        )

    @property
    def cert_url(self) -> str:
        return f"https://{self.host}/SimpleNotificationService-test.pem"

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        if request.path.endswith("/redirect.pem"):
            raise web.HTTPFound("/SimpleNotificationService-test.pem")
        if request.path.endswith(".pem"):
            return web.Response(body=self.pki.signing_pem, content_type="application/x-pem-file")
        return web.Response(text="<ConfirmSubscriptionResponse/>")


@asynccontextmanager
async def sns_certificate_server(directory: Path) -> AsyncIterator[SnsCertificateServer]:
    server = SnsCertificateServer(Pki(directory))
    app = web.Application()
    app.router.add_get("/{tail:.*}", server._handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server.pki.server_context())
    await site.start()
    server.host = f"127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


@dataclass
class SnsSigner:
    """Signs SNS messages with the test certificate's key, version 1 or 2."""

    server: SnsCertificateServer
    key: rsa.RSAPrivateKey | None = None  # another key: a forgery

    def message(
        self,
        ses_event: dict[str, Any] | None,
        at: dt.datetime,
        *,
        version: str = "2",
        topic: str = TOPIC,
        kind: str = "Notification",
        cert_url: str | None = None,
    ) -> Request:
        fields: dict[str, Any] = {
            "Type": kind,
            "MessageId": str(uuid.uuid4()),
            "TopicArn": topic,
            "Timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "SignatureVersion": version,
            "SigningCertURL": cert_url or self.server.cert_url,
        }
        names: tuple[str, ...]
        if kind == "Notification":
            fields["Message"] = json.dumps(ses_event)
            names = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
        else:
            fields["Message"] = "You have chosen to subscribe to the topic."
            fields["Token"] = uuid.uuid4().hex
            fields["SubscribeURL"] = f"https://{self.server.host}/?Action=ConfirmSubscription"
            names = (
                "Message",
                "MessageId",
                "SubscribeURL",
                "Timestamp",
                "Token",
                "TopicArn",
                "Type",
            )
        canonical = "".join(f"{n}\n{fields[n]}\n" for n in names if n in fields)
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()  # noqa: S303 - SNS v1
        key = self.key or self.server.pki.signing_key
        signature = key.sign(canonical.encode(), padding.PKCS1v15(), algorithm)
        fields["Signature"] = base64.b64encode(signature).decode()
        return {"Content-Type": "text/plain; charset=UTF-8"}, json.dumps(fields).encode()

    @staticmethod
    def bounce(
        message_id: str, to: str, at: dt.datetime, *, subtype: str = "General"
    ) -> dict[str, Any]:
        return {
            "notificationType": "Bounce",
            "bounce": {
                "bounceType": "Permanent",
                "bounceSubType": subtype,
                "bouncedRecipients": [
                    {"emailAddress": to, "action": "failed", "status": "5.1.1",
                     "diagnosticCode": "smtp; 550 5.1.1 user unknown"}
                ],
                "timestamp": at.isoformat().replace("+00:00", "Z"),
                "feedbackId": str(uuid.uuid4()),
            },
            "mail": {
                "timestamp": at.isoformat(),
                "messageId": message_id,
                "source": "no-reply@mail.example.com",
                "destination": [to],
            },
        }  # fmt: skip
