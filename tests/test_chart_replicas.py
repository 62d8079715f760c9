"""Two operator replicas by default, as `helm template` renders them: the replica count, the
PodDisruptionBudget (minAvailable 1, only with more than one replica), the pod
anti-affinity by hostname, and the readiness probe, run here against a health endpoint
and a TLS listener on loopback.

Why: the operator is every group's failure detector; with one replica, losing its node
stops crash failover until a new pod runs. Two replicas on different nodes, evicted one at
a time, keep one operator up; the injector's Service sends admission requests only to
Ready replicas, so readiness must mean "this replica's webhook answers".
"""

from __future__ import annotations

import http.server
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from chart_render import by_kind, one, render

from kgroup.core.objects import Obj
from kgroup_operator.certs import make_serving_cert

SELECTOR = {"app.kubernetes.io/name": "kgroup", "app.kubernetes.io/instance": "kg",
            "app.kubernetes.io/component": "operator"}


def pod_spec(objs: list[Obj]) -> Obj:
    spec: Obj = one(objs, "Deployment")["spec"]["template"]["spec"]
    return spec


def test_two_replicas_a_pdb_and_spread_by_hostname_by_default() -> None:
    objs = render()
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert SELECTOR.items() <= pod_labels.items()
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": SELECTOR}}
    (term,) = pod_spec(objs)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"] == {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": SELECTOR}}
    # the selector picks the operator's pods and nothing else the chart runs
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def test_one_replica_has_no_pdb_that_would_block_node_drains() -> None:
    objs = render("operator.replicas=1")
    assert one(objs, "Deployment")["spec"]["replicas"] == 1
    assert not by_kind(objs, "PodDisruptionBudget")
    assert not by_kind(render("operator.podDisruptionBudget.enabled=false"),
                       "PodDisruptionBudget")
    pdb = one(render("operator.replicas=3", "operator.podDisruptionBudget.maxUnavailable=1"),
              "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]


def test_spreading_required_none_or_replaced_by_the_users_affinity() -> None:
    (term,) = pod_spec(render("operator.spreadAcrossNodes=required"))["affinity"][
        "podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": SELECTOR}}
    assert "affinity" not in pod_spec(render("operator.spreadAcrossNodes=none"))
    mine = pod_spec(render("operator.affinity.nodeAffinity.x=y"))["affinity"]
    assert mine == {"nodeAffinity": {"x": "y"}}


def test_the_values_schema_refuses_an_unknown_spread() -> None:
    with pytest.raises(AssertionError, match="spreadAcrossNodes"):
        render("operator.spreadAcrossNodes=sometimes")


def test_with_the_injector_a_stopping_pod_serves_a_few_seconds_more() -> None:
    c = pod_spec(render("injector.enabled=true"))["containers"][0]
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert "lifecycle" not in pod_spec(render())["containers"][0]  # no webhook, no wait
    c = pod_spec(render("injector.enabled=true", "injector.drainSeconds=0"))["containers"][0]
    assert "lifecycle" not in c
    # within the pod's termination grace (Kubernetes' default 30 s): the schema's bound
    with pytest.raises(AssertionError, match="drainSeconds"):
        render("injector.enabled=true", "injector.drainSeconds=40")


# -- readiness ---------------------------------------------------------------------------


def _ready_script(health_port: int) -> str:
    c = pod_spec(render(f"operator.healthPort={health_port}", "injector.enabled=true"))[
        "containers"][0]
    cmd = c["readinessProbe"]["exec"]["command"]
    assert cmd[:2] == ["python3", "-c"]
    assert c["livenessProbe"]["exec"]["command"] != cmd  # liveness: no webhook in it
    return str(cmd[2])


@pytest.fixture
def health() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[int]:
    """A TLS listener on loopback with a certificate, answering handshakes."""
    made = make_serving_cert(["127.0.0.1"], tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(made.cert_file, made.key_file)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                conn.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(listener.getsockname()[1])
    stop.set()
    t.join()
    listener.close()


def _probe(script: str, injector_port: int | None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KGROUP_")}
    if injector_port is not None:
        env |= {"KGROUP_INJECTOR": "true", "KGROUP_INJECTOR_HOST": "127.0.0.1",
                "KGROUP_INJECTOR_PORT": str(injector_port)}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, env=env,
                          timeout=30)


def test_ready_when_health_answers_and_the_webhook_completes_a_handshake(
        health: int, webhook: int) -> None:
    script = _ready_script(health)
    assert _probe(script, webhook).returncode == 0
    assert _probe(script, None).returncode == 0  # no injector: health alone


def test_not_ready_when_the_webhook_is_down(health: int) -> None:
    result = _probe(_ready_script(health), _closed_port())
    assert result.returncode != 0 and b"Connection refused" in result.stderr


def test_not_ready_when_the_webhook_speaks_no_tls(health: int) -> None:
    # the health endpoint itself is plain HTTP: a listener, but no TLS server
    assert _probe(_ready_script(health), health).returncode != 0


def test_not_ready_when_health_is_down(webhook: int) -> None:
    assert _probe(_ready_script(_closed_port()), webhook).returncode != 0
