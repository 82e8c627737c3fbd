"""The certificates and keys of the test control plane, made fresh for each session.

A real cluster's API server serves TLS, knows its clients by certificate or token, and signs
service-account tokens with a key of its own; so does this one. One CA signs the server's
certificate (for 127.0.0.1 and the in-cluster names) and the client certificates of the
administrator (group `system:masters`) and the controller-manager. The service-account
signing key is separate: TokenRequest tokens are signed with it and verified with its
public half.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every file the control plane's programs and its clients are given."""

    ca: Path
    server: Pair
    admin: Pair
    controller_manager: Pair
    service_account_key: Path
    service_account_public: Path


class _Authority:
    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leasebox-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self.name = name
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        common_name: str,
        *,
        organization: str | None = None,
        server_names: tuple[str, ...] = (),
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server_names:
            alternatives: list[x509.GeneralName] = []
            for entry in server_names:
                try:
                    alternatives.append(x509.IPAddress(ipaddress.ip_address(entry)))
                except ValueError:
                    alternatives.append(x509.DNSName(entry))
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternatives), critical=False
            )
        return builder.sign(self.key, hashes.SHA256()), key


def make_pki(folder: Path) -> Pki:
    """Make every certificate and key in `folder` (created if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    authority = _Authority()

    def pair(
        name: str, common_name: str, organization: str | None = None, names: tuple[str, ...] = ()
    ) -> Pair:
        cert, key = authority.issue(common_name, organization=organization, server_names=names)
        return Pair(
            _write_cert(folder / f"{name}.crt", cert), _write_key(folder / f"{name}.key", key)
        )

    server_names = (
        "127.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "10.96.0.1",
    )
    signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = folder / "service-accounts.pub"
    public.write_bytes(
        signing.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca=_write_cert(folder / "ca.crt", authority.cert),
        server=pair("apiserver", "kube-apiserver", names=server_names),
        admin=pair("admin", "leasebox-test-admin", "system:masters"),
        controller_manager=pair(
            "controller-manager", "system:kube-controller-manager", "system:masters"
        ),
        service_account_key=_write_key(folder / "service-accounts.key", signing),
        service_account_public=public,
    )
