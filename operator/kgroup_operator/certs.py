"""The injector's serving certificate when no cert-manager provides one: a private CA and
a server certificate signed by it (no manual step), shared by every operator replica.

The pair lives in one Secret (``kgroup_operator.injector_cert``): the first replica to
find it empty makes the pair and writes it with a precondition, so two replicas never
serve two certificates; every replica serves the Secret's pair and writes the Secret's
CA bundle into the MutatingWebhookConfiguration's ``caBundle``. A pair is valid
``KGROUP_INJECTOR_CERT_SECONDS`` (a year by default) and renewed with a third of its life
left (:func:`next_step`): the new pair written with both CAs in the bundle, while every
replica's server reloads its files, then the new CA alone. Nothing is renewed by hand.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
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


@dataclass(frozen=True)
class Pair:
    """A CA's certificate and the server certificate and key it signed (PEM)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


BACKDATE = timedelta(minutes=5)
"""Certificates start this long before their making (clocks a little behind still accept
them); :func:`held` counts a certificate's age from ``not_valid_before + BACKDATE``."""


def make_serving_cert(names: list[str], directory: Path, now: datetime | None = None,
                      valid_seconds: float = VALID_SECONDS) -> ServingCert:
    """A CA and a server certificate for ``names`` (DNS names or IP addresses), written to
    ``directory`` (the key readable by its owner only; each file replaced whole, so a
    reader sees the old file or the new one)."""
    pair = make_pair(names, now, valid_seconds)
    cert_file, key_file = write_pair(pair.cert_pem, pair.key_pem, directory)
    return ServingCert(pair.ca_pem, cert_file, key_file)


def write_pair(cert_pem: bytes, key_pem: bytes, directory: Path) -> tuple[Path, Path]:
    """``tls.crt`` and ``tls.key`` in ``directory``, each replaced whole (key first: a
    server reloading on the certificate's change finds its key already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    _replace(key_file, key_pem)
    _replace(cert_file, cert_pem)
    return cert_file, key_file


def make_pair(names: list[str], now: datetime | None = None,
              valid_seconds: float = VALID_SECONDS) -> Pair:
    """A CA and a server certificate for ``names`` (DNS names or IP addresses)."""
    if not names:
        raise ValueError("the injector's certificate needs at least one name or address")
    now = now or datetime.now(UTC)
    until = now + timedelta(seconds=valid_seconds)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("kgroup-injector-ca"))
          .issuer_name(_name("kgroup-injector-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - BACKDATE).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(names[0]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(until)
            .add_extension(_san(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return Pair(ca.public_bytes(serialization.Encoding.PEM),
                cert.public_bytes(serialization.Encoding.PEM),
                key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


# -- the shared pair's life: pure decisions over what the Secret holds --------------------


class Step(Enum):
    KEEP = "keep"
    MAKE = "make"  # nothing usable held: make a pair
    RENEW = "renew"  # a third of its life left: a new pair, both CAs in the bundle
    TRIM = "trim"  # renewed long enough ago that every replica serves it: the new CA alone


@dataclass(frozen=True)
class Held:
    """What the Secret holds, as the decisions need it."""

    made_at: datetime
    expires: datetime
    cas: int  # certificates in the CA bundle


def held(cert_pem: bytes, bundle_pem: bytes) -> Held:
    """The held pair's dates and bundle size; ValueError when they cannot be read."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    cas = x509.load_pem_x509_certificates(bundle_pem)
    return Held(cert.not_valid_before_utc + BACKDATE, cert.not_valid_after_utc, len(cas))


def next_step(h: Held | None, now: datetime, settle_seconds: float) -> Step:
    """What to do with the held pair at ``now``: ``settle_seconds`` is how long after a
    renewal every replica is sure to serve the new pair (its poll and its server's file
    check), after which the old CA leaves the bundle."""
    if h is None or now >= h.expires:
        return Step.MAKE
    life = (h.expires - h.made_at).total_seconds()
    if life <= 0 or now >= h.made_at + timedelta(seconds=renew_in(life)):
        return Step.RENEW
    if h.cas > 1 and now >= h.made_at + timedelta(seconds=settle_seconds):
        return Step.TRIM
    return Step.KEEP


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    tmp.touch(mode=0o600)
    tmp.write_bytes(data)
    tmp.replace(path)
