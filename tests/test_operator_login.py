"""kopf's credentials come from the source the operator's own client reads
(``kgroup_operator.handlers.login``): a kubeconfig when ``KUBECONFIG`` is set, else in a
pod the service account at ``KUBERNETES_SERVICE_HOST``/``_PORT`` (an address, never the
``kubernetes.default.svc`` name kopf's own service-account login would resolve)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kopf
import pytest

from kgroup.apiclient import default_config
from kgroup_operator import handlers


def log_in() -> kopf.ConnectionInfo:
    login: Any = handlers.login  # kopf's decorator types it as an activity
    info: kopf.ConnectionInfo | None = login(settings=kopf.OperatorSettings())
    assert info is not None
    return info


def account(tmp: Path, token: str = "tok-1") -> Path:
    d = tmp / "serviceaccount"
    d.mkdir()
    (d / "token").write_text(token + "\n")
    (d / "ca.crt").write_text("not read here\n")
    (d / "namespace").write_text("kgroup-system")
    return d


@pytest.fixture
def in_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = account(tmp_path)
    monkeypatch.setattr(handlers, "SERVICE_ACCOUNT", d)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    return d


def test_in_a_pod_kopf_reaches_the_address_the_kubelet_gave(in_pod: Path) -> None:
    info = log_in()
    assert info.server == "https://127.0.0.1:6443"
    assert info.token == "tok-1" and info.ca_path == str(in_pod / "ca.crt")
    assert info.default_namespace == "kgroup-system"
    (in_pod / "token").write_text("tok-2\n")  # rotated: the next login (after a 401) reads it
    assert log_in().token == "tok-2"


def test_an_ipv6_service_address_is_bracketed(in_pod: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "::1")
    assert log_in().server == "https://[::1]:6443"


def test_a_pod_without_the_service_address_is_refused(in_pod: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(kopf.LoginError, match="KUBERNETES_SERVICE_HOST"):
        log_in()


def test_kubeconfig_wins_and_both_clients_read_the_same_server(
        in_pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:7443",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "kc-token"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    info = log_in()
    ours = default_config()
    assert info.server == ours.server == "https://127.0.0.1:7443"
    assert info.token == "kc-token" and ours.headers() == {"Authorization": "Bearer kc-token"}
