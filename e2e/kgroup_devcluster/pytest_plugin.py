"""pytest fixtures for tests on the local control plane (names fixed in docs/protocol.md).

Rule: a test that needs the cluster and cannot get it FAILS with the reason; it is never
skipped, because a skipped e2e suite reads as a green one.

- `cluster` (session): the running local control plane. A cluster already up (from
  `make cluster-up`) is reused and left running; otherwise this session starts one and
  the last session using it stops it (see sessions.py).
- `kube` (session): a `kubernetes.client.ApiClient` as cluster admin.
- `crd` (session): every YAML in `crds/` applied and Established; returns the CRD names.
- `namespace`: a fresh namespace per test (its `default` ServiceAccount exists), deleted
  afterwards.

Every test that uses `cluster` (directly or through another fixture) is marked `cluster`.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import yaml
from kubernetes import client

from .cluster import REPO, Cluster
from .sessions import join, leave
from .tokens import admin_api_client

CRD_DIR = REPO / "crds"
T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster: needs the local Kubernetes control plane (started once per session)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def wait_for(what: str, condition: Callable[[], T], *, timeout: float = 60.0,
             interval: float = 0.2) -> T:
    """Poll `condition()` until it returns a truthy value (returned); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    problem = ""
    try:
        c = join()
    except Exception as e:  # any reason the control plane did not come up
        problem = f"{type(e).__name__}: {e}"
    if problem:
        leave()  # stops what this session half-started, unless others use it
        pytest.fail(f"the local control plane could not start: {problem}", pytrace=False)
    try:
        yield c
    finally:
        leave()


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = admin_api_client(cluster)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _crd_names(path: Path) -> list[str]:
    names = []
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
            names.append(str(doc["metadata"]["name"]))
    return names


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> list[str]:
    files = sorted(p for p in CRD_DIR.glob("*") if p.suffix in (".yaml", ".yml"))
    names = [n for f in files for n in _crd_names(f)]
    if not names:
        pytest.fail(f"no CRD in crds/ ({CRD_DIR})", pytrace=False)
    for f in files:
        out = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f),
                              check=False)
        if out.returncode != 0:
            pytest.fail(f"kubectl apply -f {f} failed: {out.stderr.strip()}", pytrace=False)
    for name in names:
        out = cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                              f"crd/{name}", check=False)
        if out.returncode != 0:
            pytest.fail(f"CRD {name} not Established: {out.stderr.strip()}", pytrace=False)
    return names


def _namespace_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{stem}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    core = client.CoreV1Api(kube)
    name = _namespace_name(request.node.name)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"kgroup.dev/e2e": "true"})))

    def default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    try:
        wait_for(f"ServiceAccount default in {name}", default_sa)
        yield name
    finally:
        try:
            core.delete_namespace(name, propagation_policy="Background")
        except client.ApiException as e:
            if e.status != 404:
                raise
