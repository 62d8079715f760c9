"""The sidecar's probes as the kubelet runs them, against a real sidecar process on the real
API server: the exec probes' exact commands (the chart's ``sidecar.probes.mode: exec``,
``find`` on the probe files) and the httpGet probes' port. A frozen sidecar (SIGSTOP) fails
both liveness and readiness; it passes again once it runs. A sidecar whose event loop is
stuck in a call while its process runs is ended by its own watchdog (status 3, so the
kubelet restarts it: the liveness check where the chart renders no liveness probe), and
without the watchdog the same stuck sidecar stays up."""

from __future__ import annotations

import signal
import subprocess
import sys
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


# The sidecar as it ships, plus one thing only a test needs: SIGUSR1 makes the event loop's
# thread (the main thread, where Python runs signal handlers) block in a call, as a loop
# stuck in a blocking call or a deadlock would; the process and its other threads run on.
STUCK_ON_SIGUSR1 = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *_: time.sleep(3600))\n"
    "from kgroup_sidecar.main import main\n"
    "sys.exit(main())\n")
WATCHDOG_SECONDS = 6


def stuck_sidecar(cluster: object, namespace: str, tmp_path: Path, pod: str,
                  watchdog: str) -> SidecarProcess:
    """A started sidecar (KGROUP_WATCHDOG_SECONDS=``watchdog``) whose loop is then made
    stuck; returns once its API, answered by the loop, stopped answering."""
    from kgroup_devcluster.cluster import Cluster
    assert isinstance(cluster, Cluster)
    sc = SidecarProcess(pod=pod, group=GROUP, namespace=namespace,
                        kubeconfig=str(cluster.kubeconfig), workdir=tmp_path,
                        env={"KGROUP_WATCHDOG_SECONDS": watchdog},
                        command=[sys.executable, "-c", STUCK_ON_SIGUSR1]).start()
    wait_until("answering", lambda: http_status(sc.port, "/livez") == 200, timeout=30)
    sc.signal(signal.SIGUSR1)
    wait_until("the loop stuck", lambda: http_status(sc.port, "/livez") is None, timeout=10)
    return sc


def test_the_watchdog_exits_a_sidecar_whose_loop_is_stuck(
        cluster: object, target: ScriptedTarget, namespace: str, tmp_path: Path) -> None:
    sc = stuck_sidecar(cluster, namespace, tmp_path, "pod-stuck", str(WATCHDOG_SECONDS))
    stuck = time.monotonic()
    try:
        assert sc.proc is not None
        status = sc.proc.wait(WATCHDOG_SECONDS + 15)
        after = time.monotonic() - stuck
    finally:
        sc.stop()
    assert status == 3, sc.log_text()[-3000:]
    # the limit, plus at most one check period (5 s) and the beat's own period (5 s)
    assert WATCHDOG_SECONDS - 1 <= after <= WATCHDOG_SECONDS + 11, after
    text = sc.log_text()
    assert "the event loop has not turned for" in text
    assert "time.sleep" in text or "<lambda>" in text  # where it was stuck: the stack


def test_without_the_watchdog_a_stuck_sidecar_stays_up(
        cluster: object, target: ScriptedTarget, namespace: str, tmp_path: Path) -> None:
    """The variant with the watchdog off: what ends the process above is the watchdog,
    not the way the test makes the loop stuck."""
    sc = stuck_sidecar(cluster, namespace, tmp_path, "pod-stuck-on", "0")
    try:
        assert sc.proc is not None
        with pytest.raises(subprocess.TimeoutExpired):
            sc.proc.wait(WATCHDOG_SECONDS + 15)
        assert http_status(sc.port, "/livez") is None  # still stuck, still running
    finally:
        sc.stop()
