"""The local control plane's certificates and keys, made once per state dir.

Rule: every file is written only when it is missing, so a restart keeps the identities
the running processes and written kubeconfigs already trust. Nothing here talks to a
process; `cluster.py` decides where the files go and which component reads which.

Why: the API server authenticates every client by a certificate signed by one CA (the
admin is in `system:masters`; the controller manager and scheduler carry the user names
their default RBAC roles are bound to), and it signs service-account tokens with an RSA
key whose public half it also uses to verify them.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=3650)
_APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_APISERVER_IPS = ("127.0.0.1", "10.96.0.1")


FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate to issue: file stem, user name, groups."""

    stem: str
    common_name: str
    organizations: tuple[str, ...] = ()


# Who talks to the API server. kwok acts on nodes and pods of every namespace, so it is
# an admin like the test code.
CLIENTS = (
    ClientIdentity("admin", "kgroup-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("kwok", "kgroup-kwok", ("system:masters",)),
    # The API server's identity towards the kubelet (logs, exec, port-forward).
    ClientIdentity("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                   ("system:masters",)),
)


@dataclass(frozen=True)
class Pki:
    """Paths of the files under `<state>/pki`."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.dir / "front-proxy-ca.crt"

    @property
    def front_proxy_ca_key(self) -> Path:
        return self.dir / "front-proxy-ca.key"

    @property
    def front_proxy_client_cert(self) -> Path:
        return self.dir / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.dir / "front-proxy-client.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    @property
    def kubelet_serving_cert(self) -> Path:
        return self.dir / "kubelet-serving.crt"

    @property
    def kubelet_serving_key(self) -> Path:
        return self.dir / "kubelet-serving.key"

    def client_cert(self, stem: str) -> Path:
        return self.dir / f"{stem}.crt"

    def client_key(self, stem: str) -> Path:
        return self.dir / f"{stem}.key"


def kubeconfig_text(*, server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    """A kubeconfig for `server` with a client certificate (JSON, which is valid YAML)."""
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kgroup-dev", "cluster": {
            "server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "kgroup-dev", "context": {"cluster": "kgroup-dev", "user": user}}],
        "current-context": "kgroup-dev",
    }
    return json.dumps(config, indent=2) + "\n"  # JSON is valid YAML


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    path.touch(mode=0o600)
    path.write_bytes(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_key(path: Path) -> rsa.RSAPrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise TypeError(f"{path}: not an RSA key")
    return key


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: rsa.RSAPrivateKey
) -> x509.CertificateBuilder:
    # Backdated a little so a clock a few seconds behind still accepts the certificate.
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
    )


def _ensure_ca(
    cert_path: Path, key_path: Path, common_name: str
) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        return cert, _load_key(key_path)
    key = _new_key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=True,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert, key


def _leaf(
    *,
    ca: tuple[x509.Certificate, rsa.RSAPrivateKey],
    cert_path: Path,
    key_path: Path,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: x509.SubjectAlternativeName | None = None,
) -> None:
    if cert_path.exists() and key_path.exists():
        return
    ca_cert, ca_key = ca
    key = _new_key()
    builder = (
        _builder(subject, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=True,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=False)
    _write_key(key_path, key)
    _write_cert(cert_path, builder.sign(ca_key, hashes.SHA256()))


def ensure_pki(directory: Path) -> Pki:
    """Create whatever is missing under `directory` and return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    pki = Pki(directory)
    ca = _ensure_ca(pki.ca_cert, pki.ca_key, "kgroup-devcluster-ca")
    sans = x509.SubjectAlternativeName(
        [x509.DNSName(n) for n in _APISERVER_DNS]
        + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _APISERVER_IPS]
    )
    _leaf(
        ca=ca,
        cert_path=pki.apiserver_cert,
        key_path=pki.apiserver_key,
        subject=_name("kube-apiserver"),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
    )
    for client in CLIENTS:
        _leaf(
            ca=ca,
            cert_path=pki.client_cert(client.stem),
            key_path=pki.client_key(client.stem),
            subject=_name(client.common_name, client.organizations),
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
    # The request-header (front proxy) CA: the API server publishes it for aggregated API
    # servers, and the controller manager and scheduler expect it in their delegated
    # authentication; without it they log an error at every sync.
    front_proxy_ca = _ensure_ca(
        pki.front_proxy_ca_cert, pki.front_proxy_ca_key, "kgroup-devcluster-front-proxy-ca"
    )
    _leaf(
        ca=front_proxy_ca,
        cert_path=pki.front_proxy_client_cert,
        key_path=pki.front_proxy_client_key,
        subject=_name(FRONT_PROXY_CLIENT),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    if not (pki.sa_key.exists() and pki.sa_pub.exists()):
        key = _new_key()
        _write_key(pki.sa_key, key)
        pki.sa_pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pki


def ensure_kubelet_pki(directory: Path, node_name: str) -> Pki:
    """The real node's certificates (made once, like the rest): its client certificate
    (`system:node:<name>` in `system:nodes`, so the Node authorizer and NodeRestriction
    apply to it, stem `kubelet`) and its serving certificate for 127.0.0.1, which the
    API server verifies with the cluster CA."""
    pki = ensure_pki(directory)
    ca = _ensure_ca(pki.ca_cert, pki.ca_key, "kgroup-devcluster-ca")
    _leaf(
        ca=ca,
        cert_path=pki.client_cert("kubelet"),
        key_path=pki.client_key("kubelet"),
        subject=_name(f"system:node:{node_name}", ("system:nodes",)),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _leaf(
        ca=ca,
        cert_path=pki.kubelet_serving_cert,
        key_path=pki.kubelet_serving_key,
        subject=_name(f"system:node:{node_name}", ("system:nodes",)),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=x509.SubjectAlternativeName(
            [x509.DNSName(node_name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
    )
    return pki
