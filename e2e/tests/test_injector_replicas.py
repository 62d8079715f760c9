"""The sidecar injector served by two operator processes on the real API server, as two
replicas behind the injector's Service serve it: both listen on the webhook's one
address (127.0.0.1:<port>, SO_REUSEPORT: the kernel spreads connections over the two,
as the Service spreads them over Ready pods), one holds the leader Lease, the other
stands by.

Checked: the two serve one certificate (from the one Secret, whichever made it, even when
both start at once on an empty Secret), and a labelled pod is admitted with its sidecar
while the leader is stopped: no gap waiting for the standby to take the Lease.
"""

from __future__ import annotations

import base64
import secrets
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_injector
from kubernetes.client.exceptions import ApiException
from operator_harness import OperatorProcess
from test_injector import LABEL, Injector, create, sidecars

from kgroup_devcluster.pytest_plugin import wait_for

pytestmark = pytest.mark.cluster

injector = test_injector.injector  # the fixture: the chart's webhook and one operator


def serving(op: OperatorProcess) -> bool:
    return "sidecar injector on https://" in op.log_text()


@pytest.fixture
def standby(injector: Injector, tmp_path: Path) -> Iterator[OperatorProcess]:
    """A second operator process like the first, started after it: the standby."""
    d = tmp_path / "standby"
    d.mkdir()
    op = OperatorProcess(injector.op.cluster, injector.namespace, d, env=injector.op.env)
    op.start()
    try:
        wait_for("the standby serving the webhook", lambda: serving(op), timeout=60)
        yield op
    finally:
        op.stop()
        text = op.log_text()
        sys.stdout.write(text[-3000:])
        assert "Traceback" not in text, "the standby logged a traceback"


def port_of(inj: Injector) -> int:
    return int(inj.op.env["KGROUP_INJECTOR_PORT"])


def served_certs(port: int, tries: int = 40) -> set[bytes]:
    """The certificates the webhook's address presents over ``tries`` new connections
    (each from a new source port: the kernel spreads them over both listeners)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    seen: set[bytes] = set()
    for _ in range(tries):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s, \
                ctx.wrap_socket(s) as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            seen.add(der)
    return seen


def secret_cert(inj: Injector) -> bytes:
    s: Any = inj.core.read_namespaced_secret(f"{inj.webhook}-tls", inj.namespace)
    return ssl.PEM_cert_to_DER_cert(base64.b64decode(s.data["tls.crt"]).decode())


def published_ca(inj: Injector) -> bytes:
    cfg: Any = inj.admission.read_mutating_webhook_configuration(inj.webhook)
    return base64.b64decode(cfg.webhooks[0].client_config.ca_bundle)


def leader_of(*ops: OperatorProcess) -> OperatorProcess:
    def find() -> OperatorProcess | None:
        leaders = [op for op in ops if op.health() and "standby" not in op.health()]
        return leaders[0] if len(leaders) == 1 else None
    return wait_for("exactly one leader", find, timeout=60)


def test_both_serve_the_one_secrets_certificate_and_publish_its_ca(
        injector: Injector, standby: OperatorProcess) -> None:
    assert served_certs(port_of(injector)) == {secret_cert(injector)}
    s: Any = injector.core.read_namespaced_secret(f"{injector.webhook}-tls",
                                                  injector.namespace)
    assert published_ca(injector) == base64.b64decode(s.data["ca.crt"])


def test_started_together_on_an_empty_secret_they_still_serve_one_certificate(
        injector: Injector, standby: OperatorProcess) -> None:
    injector.op.stop()
    standby.stop()
    injector.core.delete_namespaced_secret(f"{injector.webhook}-tls", injector.namespace)
    injector.op.start()
    standby.start()
    for op in (injector.op, standby):
        wait_for("both serving again", lambda op=op: op.log_text().count(  # type: ignore[misc]
            "sidecar injector on https://") >= 2, timeout=60)
    wait_for("the new CA published",
             lambda: _admitted(injector, f"again-{secrets.token_hex(2)}"), timeout=60)
    assert served_certs(port_of(injector)) == {secret_cert(injector)}


def _admitted(inj: Injector, name: str) -> bool:
    try:
        return len(sidecars(create(inj, name, labels=LABEL))) == 1
    except ApiException:
        return False


def test_a_labelled_pod_is_admitted_while_the_leader_is_stopped(
        injector: Injector, standby: OperatorProcess) -> None:
    leader = leader_of(injector.op, standby)
    other = standby if leader is injector.op else injector.op
    assert "standby" in other.health()
    stopped = time.monotonic()
    leader.stop()  # SIGTERM: its listener closes; the standby has not taken the Lease yet
    refused: list[str] = []
    admitted = 0
    while time.monotonic() - stopped < 8:  # past the 6 s leader Lease: both phases
        name = f"during-{secrets.token_hex(3)}"
        try:
            pod = create(injector, name, labels=LABEL)
        except ApiException as exc:
            refused.append(f"{time.monotonic() - stopped:.1f}s: {exc.status} {exc.reason}")
            continue
        assert len(sidecars(pod)) == 1
        admitted += 1
        time.sleep(0.2)
    print(f"leader stopped: {admitted} labelled pods admitted with the sidecar in 8 s, "
          f"{len(refused)} refused")
    assert not refused, refused
    assert admitted >= 3
    leader_of(other)  # the standby leads now, and still serves
    assert _admitted(injector, "after-takeover")
