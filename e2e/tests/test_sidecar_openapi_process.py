"""A real ``kgroup-sidecar`` process (on the local API server, the test playing the
operator) answers every call as its OpenAPI document says: each (path, method, status)
met here is documented and each JSON body matches its schema. Together with
tests/test_sidecar_openapi.py (the 503 "try again" on release) every documented
response of the document is produced by the sidecar and checked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kgroup.client import SidecarAddress, SidecarClient
from kgroup_devcluster.cluster import Cluster
from kgroup_testing.sidecar_harness import ScriptedTarget, SidecarProcess, wait_until
from tests.openapi_check import Checker

pytestmark = pytest.mark.cluster
GROUP = "orders"


@pytest.fixture
def sidecar(cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
            tmp_path: Path) -> Iterator[tuple[SidecarProcess, ScriptedTarget]]:
    target = ScriptedTarget(kube, namespace, GROUP)
    target.create(partitions=3)
    sc = SidecarProcess("pod-a", GROUP, namespace, str(cluster.kubeconfig), tmp_path).start()
    try:
        yield sc, target
    finally:
        sc.stop()
    assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def test_a_real_sidecar_answers_as_its_openapi_document_says(
        sidecar: tuple[SidecarProcess, ScriptedTarget]) -> None:
    sc, target = sidecar
    checker = Checker()
    address = SidecarAddress.parse(sc.url)

    def call(method: str, path: str, body: str | None = None) -> tuple[int, str]:
        conn = address.connection(10)
        try:
            conn.request(method, path, body=body.encode() if body is not None else None)
            resp = conn.getresponse()
            text = resp.read().decode()
            checker.check(method, path, resp.status, resp.getheader("Content-Type") or "",
                          text)
            return resp.status, text
        finally:
            conn.close()

    wait_until("sidecar up", lambda: call("GET", "/healthz")[0] == 200, timeout=30)
    assert call("GET", "/livez")[0] == 200
    assert call("GET", "/readyz")[0] == 503  # no target yet
    target.assign({"pod-a": [0, 1]})
    c = SidecarClient(sc.url)
    held = wait_until("held", lambda: len(c.assignment().partitions) == 2
                      and c.assignment().partitions, timeout=30)
    wait_until("ready", lambda: call("GET", "/readyz")[0] == 200, timeout=30)
    assert call("GET", "/v1/assignment")[0] == 200
    assert call("GET", "/v1/assignment?since=0&wait=1")[0] == 200
    assert call("GET", "/v1/assignment?since=x")[0] == 400
    assert call("GET", "/v1/assignment?wait=301")[0] == 400
    p0, p1 = held
    report = (f'{{"partitions": [{{"partition": 0, "token": {p0.token}, "position": "1-0", '
              f'"lag": 3}}, {{"partition": 2, "token": 1}}]}}')
    assert call("POST", "/v1/health", report)[0] == 200
    assert call("POST", "/v1/health", '{"partitions": 1}')[0] == 400
    assert call("POST", "/v1/health", "not json")[0] == 400
    status, text = call("GET", "/v1/group")
    assert status == 200 and json.loads(text)["partitions"] == 3, text
    assert call("GET", "/metrics")[0] == 200
    assert call("GET", "/openapi.yaml")[0] == 200
    assert call("POST", "/v1/partitions/x/release", '{"token": 1}')[0] == 400
    assert call("POST", "/v1/partitions/1/release", '{"token": "1"}')[0] == 400
    assert call("POST", "/v1/partitions/2/release", '{"token": 1}')[0] == 404
    assert call("POST", "/v1/partitions/1/release", f'{{"token": {p1.token + 5}}}')[0] == 409
    release = f'{{"token": {p1.token}, "position": "9-0"}}'
    assert call("POST", "/v1/partitions/1/release", release)[0] == 200
    missing = checker.documented() - checker.seen
    # the unit twins' (tests/test_sidecar_openapi.py)
    assert missing == {("POST", "/v1/partitions/{n}/release", "503"), ("GET", "/v1/group", "503")}
