"""The sidecar's probes as the kubelet runs them, against a real sidecar process on the real
API server: the exec probes' exact commands (the chart's ``sidecar.probes.mode: exec``,
``find`` on the probe files) and the httpGet probes' port. A frozen sidecar (SIGSTOP) fails
both liveness and readiness; it passes again once it runs."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kgroup_sidecar.probe_files import ALIVE, READY, probe_command
from kgroup_testing.sidecar_harness import ScriptedTarget, SidecarProcess, free_port, wait_until

pytestmark = pytest.mark.cluster
GROUP = "probed"


def passes(command: list[str]) -> bool:
    """What the kubelet's exec probe decides: exit status 0."""
    return subprocess.run(command, capture_output=True, timeout=10).returncode == 0


@pytest.fixture
def target(kube: client.ApiClient, crd: list[str], namespace: str) -> ScriptedTarget:
    t = ScriptedTarget(kube, namespace, GROUP)
    t.create(partitions=2)
    return t


@pytest.fixture
def sidecar(cluster: object, target: ScriptedTarget, namespace: str, tmp_path: Path
            ) -> Iterator[SidecarProcess]:
    from kgroup_devcluster.cluster import Cluster
    assert isinstance(cluster, Cluster)
    probe_port = free_port()
    sc = SidecarProcess(pod="pod-a", group=GROUP, namespace=namespace,
                        kubeconfig=str(cluster.kubeconfig), workdir=tmp_path,
                        env={"KGROUP_PROBE_DIR": str(tmp_path / "probe"),
                             "KGROUP_PROBE_LISTEN": f"127.0.0.1:{probe_port}"})
    sc.probe_port = probe_port  # type: ignore[attr-defined]
    sc.start()
    try:
        yield sc
    finally:
        sc.signal(signal.SIGCONT)
        sc.stop()
    assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def http_status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def test_exec_and_http_probes_follow_the_sidecar_and_fail_when_it_is_frozen(
        sidecar: SidecarProcess, target: ScriptedTarget, tmp_path: Path) -> None:
    probe_dir = str(tmp_path / "probe")
    alive, ready = probe_command(probe_dir, ALIVE), probe_command(probe_dir, READY)
    port: int = sidecar.probe_port  # type: ignore[attr-defined]
    wait_until("alive", lambda: passes(alive), timeout=30)
    assert not passes(ready)  # not a member of any target yet
    assert http_status(port, "/livez") == 200 and http_status(port, "/readyz") == 503
    assert http_status(port, "/v1/assignment") == 404  # the probe port serves probes only
    target.assign({"pod-a": [0, 1]})
    wait_until("ready", lambda: passes(ready), timeout=30)
    assert http_status(port, "/readyz") == 200
    sidecar.signal(signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        assert http_status(port, "/livez") is None  # no answer: the httpGet probe fails
        wait_until("readiness fails", lambda: not passes(ready), timeout=30)
        unready_after = time.monotonic() - frozen
        assert passes(alive)  # liveness is slower to judge: a restart costs every partition
        wait_until("liveness fails", lambda: not passes(alive), timeout=45)
        dead_after = time.monotonic() - frozen
    finally:
        sidecar.signal(signal.SIGCONT)
    # the files' thresholds (15 s, 30 s) plus at most one heartbeat period (5 s)
    assert 9 <= unready_after <= 21, unready_after
    assert 24 <= dead_after <= 36, dead_after
    wait_until("alive again", lambda: passes(alive), timeout=15)
    assert http_status(port, "/livez") == 200


def test_a_ready_file_left_by_an_earlier_run_is_removed_at_start(
        cluster: object, target: ScriptedTarget, namespace: str, tmp_path: Path) -> None:
    from kgroup_devcluster.cluster import Cluster
    assert isinstance(cluster, Cluster)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / READY).write_text("")  # fresh, as a crashed container would leave it
    sc = SidecarProcess(pod="pod-b", group=GROUP, namespace=namespace,
                        kubeconfig=str(cluster.kubeconfig), workdir=tmp_path,
                        env={"KGROUP_PROBE_DIR": str(probe_dir)}).start()
    try:
        wait_until("alive", lambda: passes(probe_command(str(probe_dir), ALIVE)), timeout=30)
        assert not passes(probe_command(str(probe_dir), READY))
        assert sc.terminate() == 0
    finally:
        sc.stop()
    assert not (probe_dir / ALIVE).exists()  # removed at a graceful exit
