"""The operator's Lease watch (its own aiohttp session) sends the credentials the
operator's client configuration read (kgroup.apiclient.ApiConfig): a kubeconfig's token,
a token file read again when it is rotated, none when there is none (a watch without a
pod's token lists as ``system:anonymous``: 403)."""

from __future__ import annotations

import json
from pathlib import Path

from kgroup.apiclient import kubeconfig_config
from kgroup_operator.lease_watch import Http


def configuration(tmp: Path, user: dict[str, str]) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(json.dumps({
        "current-context": "pod",
        "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
    }))
    return path


def test_a_kubeconfig_token_is_sent(tmp_path: Path) -> None:
    http = Http(kubeconfig_config(configuration(tmp_path, {"token": "tok"})))
    assert http.headers()["Authorization"] == "Bearer tok"
    assert http.leases_url("ns") == "https://127.0.0.1:1/apis/coordination.k8s.io/v1/" \
        "namespaces/ns/leases"


def test_a_rotated_token_file_is_sent_at_once(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    http = Http(kubeconfig_config(configuration(tmp_path, {"tokenFile": str(token)})))
    assert http.headers()["Authorization"] == "Bearer first"
    token.write_text("second-and-longer\n")
    assert http.headers()["Authorization"] == "Bearer second-and-longer"


def test_no_token_sends_no_header(tmp_path: Path) -> None:
    assert "Authorization" not in Http(kubeconfig_config(configuration(tmp_path, {}))).headers()
