"""The injector's serving certificate when no cert-manager provides one: a private CA and
a server certificate signed by it, made at the active operator's start (no manual step).

The CA's certificate is what the MutatingWebhookConfiguration's ``caBundle`` must hold;
the operator writes it there itself (:func:`kgroup_operator.injector.publish_ca`). Each
start makes a new pair, valid :data:`VALID_DAYS`: a restarted or newly elected operator
replaces the bundle, so nothing needs renewing by hand.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_file: Path
    key_file: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def make_serving_cert(names: list[str], directory: Path,
                      now: datetime | None = None) -> ServingCert:
    """A CA and a server certificate for ``names`` (DNS names or IP addresses), written to
    ``directory`` (the key readable by its owner only)."""
    if not names:
        raise ValueError("the injector's certificate needs at least one name or address")
    now = now or datetime.now(UTC)
    until = now + timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("kgroup-injector-ca"))
          .issuer_name(_name("kgroup-injector-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - timedelta(minutes=5)).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(names[0]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(until)
            .add_extension(_san(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.touch(mode=0o600)
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ServingCert(ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file)
