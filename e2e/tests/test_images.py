"""`make images`: the operator, sidecar and worker images built from docker/ by buildah,
cached by content, loaded into a real containerd, slim, and starting there.

The first run on a machine builds the base image and the three images (cold: see
docker/README.md); afterwards the module fixture finds every archive in the cache in
seconds. The containerd is one this module starts in a temp dir (its own root, state and
socket) and stops; the images run in it with runc (`ctr run --net-host`: loopback only), as
the real node's containerd would run them.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kgroup_devcluster import images
from kgroup_devcluster.images import Built, build_all, load, loaded_image_id

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

TAGS = {
    "operator": "ghcr.io/kgroup/kgroup-operator:0.1.0",
    "sidecar": "ghcr.io/kgroup/kgroup-sidecar:0.1.0",
    "worker": "ghcr.io/kgroup/kgroup-pyspark-worker:0.1.0",
}
# What each image's Python must and must not be able to import.
HOLDS = {
    "operator": {"kgroup", "kgroup_operator", "kopf", "aiohttp", "pydantic"},
    "sidecar": {"kgroup", "kgroup_sidecar", "aiohttp", "prometheus_client"},
    "worker": {"kgroup", "kgroup_pipeline", "pyspark", "redis", "pyarrow", "pandas"},
}
TOOLING = {"kgroup_sim", "kgroup_testing", "kgroup_devcluster", "kgroup_devtools", "kgroup.sim",
           "kgroup.crdgen", "pytest"}
"""Test tooling: the simulation (with its broken variants), the harnesses, the dev cluster."""
LACKS = {
    "operator": TOOLING | {"kgroup_sidecar", "kgroup_pipeline", "pyspark", "redis",
                           "pyarrow", "pandas", "kubernetes", "urllib3"},  # one client stack
    "sidecar": TOOLING | {"kopf", "kubernetes", "kgroup_operator", "kgroup_pipeline",
                          "pyspark", "redis", "pyarrow", "pandas"},
    "worker": TOOLING | {"kopf", "kubernetes", "aiohttp", "kgroup_operator",
                         "kgroup_sidecar"},
}
# The project's packages each image installs (``*-packages/<name>/``), nothing else of ours.
PACKAGES = {
    "operator": {"kgroup", "kgroup_operator"},
    "sidecar": {"kgroup", "kgroup_sidecar"},
    "worker": {"kgroup", "kgroup_pipeline"},
}
# Runs inside an image: which modules import-resolve, where any kgroup_devcluster
# directory is, and what is left of the build's source tree.
SURVEY = """
import importlib.util, json, os, sys
names = sys.argv[1:]
found = {n: importlib.util.find_spec(n) is not None for n in names}
dev = [d for top in ("/usr", "/opt", "/src", "/tmp", "/root", "/home") if os.path.isdir(top)
       for d, _, _ in os.walk(top) if d.endswith("/kgroup_devcluster")]
src = sorted(os.listdir("/src")) if os.path.isdir("/src") else []
print(json.dumps({"found": found, "dev": dev, "src": src, "uid": os.getuid()}))
"""
_ids = itertools.count()


@pytest.fixture(scope="module")
def built() -> dict[str, Built]:
    return {b.image.name: b for b in build_all()}


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A containerd of this module's own (root, state, socket in a temp dir); stopped after,
    leaving no shim process and no mount behind."""
    tmp = tmp_path_factory.mktemp("containerd")
    address = str(tmp / "containerd.sock")
    config = tmp / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{tmp / "root"}"\n'
        f'state = "{tmp / "state"}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{address}"\n'
        f'[ttrpc]\n  address = "{address}.ttrpc"\n'
        '[debug]\n  address = ""\n'
        '[metrics]\n  address = ""\n')
    log_path = tmp / "containerd.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(["containerd", "--config", str(config)], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["ctr", "--address", address, "version"],
                             capture_output=True, check=False).returncode != 0:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "containerd did not answer in 30 s"
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shims = subprocess.run(["pgrep", "-f", f"-address {address}"], capture_output=True,
                           text=True, check=False).stdout.split()
    assert shims == [], f"shims left running: {shims}"
    assert str(tmp) not in Path("/proc/self/mounts").read_text(), "mounts left behind"


@pytest.fixture(scope="module")
def loaded(built: dict[str, Built], containerd: str) -> dict[str, bool]:
    """Each image imported into the test's containerd (whether the import happened)."""
    return {name: load(b, containerd) for name, b in built.items()}


def run_in(address: str, tag: str, *argv: str, env: dict[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a command in a container of the image (host network: loopback only here)."""
    env_args = [a for k, v in (env or {}).items() for a in ("--env", f"{k}={v}")]
    return subprocess.run(
        ["ctr", "--address", address, "--namespace", "k8s.io", "run", "--rm", "--net-host",
         *env_args, tag, f"kgroup-images-test-{next(_ids)}", *argv],
        text=True, capture_output=True, timeout=timeout, check=False)


def test_each_image_is_built_with_its_tag_into_the_cache(built: dict[str, Built]) -> None:
    assert {name: b.tag for name, b in built.items()} == TAGS
    for b in built.values():
        assert b.archive.is_file() and b.archive.is_relative_to(images.CACHE)
        assert b.image_id.startswith("sha256:")
        # the archive's own config: the builder's storage tag may name a later build of
        # other sources (another worktree), which never reaches this node
        assert images.archive_labels(b.archive)["dev.kgroup.image-key"] == b.key


def test_a_warm_build_with_unchanged_sources_builds_nothing(built: dict[str, Built]) -> None:
    started = time.monotonic()
    again = {b.image.name: b for b in build_all()}
    elapsed = time.monotonic() - started
    assert [b.built for b in again.values()] == [False, False, False]
    assert {n: b.key for n, b in again.items()} == {n: b.key for n, b in built.items()}
    assert {n: b.archive for n, b in again.items()} == {n: b.archive for n, b in built.items()}
    assert elapsed < 30, f"warm build took {elapsed:.1f} s"


def test_load_imports_each_archive_once(built: dict[str, Built], containerd: str,
                                        loaded: dict[str, bool]) -> None:
    assert loaded == {"operator": True, "sidecar": True, "worker": True}
    for b in built.values():
        assert loaded_image_id(containerd, b.tag) == b.image_id
        assert load(b, containerd) is False  # the same image is there: nothing to do


def image_contents(archive: Path) -> tuple[set[str], dict[str, int]]:
    """The project's packages an image's archive installs, and their files (path -> bytes)."""
    ours = images.project_files(images.archive_files(archive))
    return {p.split("-packages/", 1)[1].split("/", 1)[0] for p in ours}, ours


@pytest.mark.parametrize("name", ["operator", "sidecar", "worker"])
def test_each_image_holds_its_process_code_and_no_test_tooling(
        built: dict[str, Built], name: str) -> None:
    """Read from the archive itself (every layer, whiteouts applied): the image holds its
    component's package and the core, and no file of the simulation, its broken variants
    or a test harness (docs/design.md, "What ships")."""
    packages, files = image_contents(built[name].archive)
    assert packages == PACKAGES[name]
    tooling = [p for p in files if "/sim/kgroup_sim/" in p or "/testing" in p
               or "/variants" in p or "/crdgen" in p or "/crd_docs" in p]
    assert tooling == []
    assert any("/kgroup/core/" in p for p in files)  # the core is there


@pytest.mark.parametrize("name", ["operator", "sidecar", "worker"])
def test_each_image_holds_its_components_packages_only(
        built: dict[str, Built], containerd: str, loaded: dict[str, bool], name: str) -> None:
    proc = run_in(containerd, built[name].tag, "python3", "-c", SURVEY,
                  *sorted(HOLDS[name] | LACKS[name]))
    assert proc.returncode == 0, proc.stderr
    survey = json.loads(proc.stdout)
    found = {n for n, ok in survey["found"].items() if ok}
    assert HOLDS[name] <= found, HOLDS[name] - found
    assert not LACKS[name] & found, LACKS[name] & found
    assert survey["dev"] == []  # no kgroup_devcluster directory anywhere
    assert survey["src"] == []  # the build's source tree was removed
    assert survey["uid"] == 10001  # the unprivileged user


def test_the_operator_entry_point_starts(built: dict[str, Built], containerd: str,
                                         loaded: dict[str, bool]) -> None:
    proc = run_in(containerd, built["operator"].tag, "kgroup-operator", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: kgroup-operator" in proc.stdout


def test_the_sidecar_entry_point_starts_and_refuses_missing_settings(
        built: dict[str, Built], containerd: str, loaded: dict[str, bool]) -> None:
    # Every module imports; with no pod settings in the environment it exits 2 (by design).
    proc = run_in(containerd, built["sidecar"].tag, "kgroup-sidecar")
    assert proc.returncode == 2, proc.stderr
    assert "kgroup-sidecar: missing required environment variable" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_sidecar_starts_light_and_its_exec_probes_binary_is_there(
        built: dict[str, Built], containerd: str, loaded: dict[str, bool]) -> None:
    """What a running sidecar imports (no pydantic, no YAML, no Kubernetes client: memory,
    docs/design.md), and `find`, which the chart's exec probes run, is in the image."""
    proc = run_in(containerd, built["sidecar"].tag, "python3", "-c",
                  "import sys, kgroup_sidecar.main; print(sorted({m.split('.')[0] for m in "
                  "sys.modules} & {'pydantic', 'yaml', 'kubernetes', 'urllib3', 'kopf'}))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    find = run_in(containerd, built["sidecar"].tag, "find", "/nonexistent", "-mmin", "+0.5",
                  "-exec", "false", "{}", "+")
    assert find.returncode == 1  # a missing probe file fails the probe


@pytest.mark.spark
def test_the_worker_image_runs_a_local_pyspark_job_on_loopback(
        built: dict[str, Built], containerd: str, loaded: dict[str, bool]) -> None:
    job = ("from pyspark.sql import SparkSession\n"
           "s = (SparkSession.builder.master('local[1]')"
           ".config('spark.ui.enabled', 'false')"
           ".config('spark.driver.bindAddress', '127.0.0.1').getOrCreate())\n"
           "print('sum', s.range(1000).selectExpr('sum(id)').first()[0])\n"
           "s.stop()\n")
    proc = run_in(containerd, built["worker"].tag, "python3", "-c", job,
                  env={"SPARK_LOCAL_IP": "127.0.0.1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sum 499500" in proc.stdout
    worker_help = run_in(containerd, built["worker"].tag, "python3", "-m",
                         "kgroup_pipeline.worker", "--help")
    assert worker_help.returncode == 0, worker_help.stderr
    assert "usage: kgroup_pipeline.worker" in worker_help.stdout
