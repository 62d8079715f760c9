"""The injector's serving certificate when no cert-manager provides one: a private CA and
a server certificate signed by it, made at the active operator's start (no manual step).

The CA's certificate is what the MutatingWebhookConfiguration's ``caBundle`` must hold;
the operator writes it there itself (``kgroup_operator.injector``). Each start makes a
new pair, valid ``KGROUP_INJECTOR_CERT_SECONDS`` (a year by default), and the running
operator renews it once two thirds of that have passed (:func:`renew_in`): a new pair
written over the files (kopf's server reloads them), the bundle holding both CAs while
the server switches, then the new one alone. Nothing is renewed by hand.
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

VALID_SECONDS = 365 * 86400.0


def renew_in(valid_seconds: float) -> float:
    """Seconds after its making when a certificate valid ``valid_seconds`` is renewed:
    with a third of its life left, so a failed renewal has time to be retried."""
    if valid_seconds <= 0:
        raise ValueError(f"a certificate's validity must be positive, not {valid_seconds}")
    return valid_seconds * 2 / 3


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


def make_serving_cert(names: list[str], directory: Path, now: datetime | None = None,
                      valid_seconds: float = VALID_SECONDS) -> ServingCert:
    """A CA and a server certificate for ``names`` (DNS names or IP addresses), written to
    ``directory`` (the key readable by its owner only; each file replaced whole, so a
    reader sees the old file or the new one)."""
    if not names:
        raise ValueError("the injector's certificate needs at least one name or address")
    now = now or datetime.now(UTC)
    until = now + timedelta(seconds=valid_seconds)
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
    _replace(key_file, key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    _replace(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return ServingCert(ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file)


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    tmp.touch(mode=0o600)
    tmp.write_bytes(data)
    tmp.replace(path)
