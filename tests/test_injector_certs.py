"""The injector's self-made certificate (kgroup_operator.certs): a server certificate for
its names, signed by a CA of its own; files replaced whole; when it is renewed."""

from __future__ import annotations

import ipaddress
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from kgroup_operator.certs import make_serving_cert, renew_in


def test_the_server_certificate_is_signed_by_its_ca_for_its_names(tmp_path: Path) -> None:
    now = datetime(2026, 11, 28, tzinfo=UTC)
    made = make_serving_cert(["kg-kgroup-injector.ns.svc", "127.0.0.1"], tmp_path, now=now,
                             valid_seconds=3600)
    ca = x509.load_pem_x509_certificate(made.ca_pem)
    cert = x509.load_pem_x509_certificate(made.cert_file.read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["kg-kgroup-injector.ns.svc"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert cert.not_valid_after_utc == now + timedelta(hours=1)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert stat.S_IMODE(made.key_file.stat().st_mode) == 0o600


def test_a_renewal_replaces_both_files_with_another_pair(tmp_path: Path) -> None:
    one = make_serving_cert(["127.0.0.1"], tmp_path)
    old = one.cert_file.read_bytes(), one.key_file.read_bytes()
    two = make_serving_cert(["127.0.0.1"], tmp_path)
    assert two.ca_pem != one.ca_pem
    assert (two.cert_file.read_bytes(), two.key_file.read_bytes()) != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt", "tls.key"]


def test_renewal_comes_with_a_third_of_the_life_left() -> None:
    assert renew_in(365 * 86400) == pytest.approx(243.33 * 86400, rel=1e-4)
    assert renew_in(30) == 20
    with pytest.raises(ValueError, match="positive"):
        renew_in(0)
    with pytest.raises(ValueError, match="name"):
        make_serving_cert([], Path("/nonexistent"))
