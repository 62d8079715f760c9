"""The real node (containerd + runc + a kubelet on 127.0.0.1) does what kgroup's pods
will need from a kubelet: it registers and is Ready, runs a locked-down hostNetwork pod,
serves logs and exec through the API server, restarts a killed container, sends SIGTERM
on delete, and leaves nothing on the host when its cluster goes down.

Each test waits for a condition, never a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kgroup_devcluster import Cluster, hostclean, node, node_images
from kgroup_devcluster.cluster import ensure_up, stop
from kgroup_devcluster.pytest_plugin import wait_for

pytestmark = pytest.mark.cluster

UID = 10001
# Prints who it runs as, then waits; on SIGTERM writes the termination message and exits 0.
SCRIPT = ('trap \'echo "got SIGTERM" > /dev/termination-log; echo bye; exit 0\' TERM; '
          'echo "hello from uid $(id -u)"; while true; do sleep 0.1; done')
HOLD = "kgroup.dev/test-hold"  # a finalizer keeps a deleted pod's final status readable


def real_pod(name: str, *, finalizers: list[str] | None = None) -> dict[str, Any]:
    """A pod for the real node, locked down as kgroup's chart runs its containers."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "finalizers": finalizers or []},
        "spec": {
            "hostNetwork": True, "dnsPolicy": "Default",
            "nodeSelector": node.NODE_SELECTOR, "tolerations": [node.TOLERATION],
            "terminationGracePeriodSeconds": 30,
            "automountServiceAccountToken": True,
            "securityContext": {"runAsUser": UID, "runAsGroup": UID, "runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": node_images.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", SCRIPT],
                "securityContext": {"readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def _pod(kube: client.ApiClient, namespace: str, name: str) -> Any:
    return client.CoreV1Api(kube).read_namespaced_pod(name, namespace)


def _running(kube: client.ApiClient, namespace: str, name: str) -> Any:
    """The pod's main container status when it runs and the pod is Ready, else None."""
    pod = _pod(kube, namespace, name)
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    statuses = pod.status.container_statuses or []
    if ready and statuses and statuses[0].state.running is not None:
        return statuses[0]
    return None


def _start(kube: client.ApiClient, namespace: str, name: str, **kw: Any) -> Any:
    pods: Any = client.CoreV1Api(kube)
    pods.create_namespaced_pod(namespace, real_pod(name, **kw))
    return wait_for(f"pod {name} running on the real node",
                    lambda: _running(kube, namespace, name), timeout=90)


def _task_pid(cluster: Cluster, container_id: str) -> int:
    """The host PID of a container's first process, asked of the node's containerd."""
    pid = node.task_pid(container_id, cluster.state_dir)
    assert pid is not None, f"no running task {container_id}"
    return pid


def _runs(pid: int) -> bool:
    """The PID runs a program (a zombie or a process past its exit has no cmdline)."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def test_the_real_node_is_ready_on_loopback_with_its_label_and_taint(cluster: Cluster) -> None:
    n = node.get_node(cluster)
    assert n is not None and node.is_ready(n)
    assert n["metadata"]["labels"][node.LABEL_KEY] == node.LABEL_VALUE
    taints = n["spec"].get("taints", [])
    assert node.TAINT in taints
    assert all(t["key"] != node.UNINITIALIZED_TAINT for t in taints)
    assert {"type": "InternalIP", "address": "127.0.0.1"} in n["status"]["addresses"]
    assert [a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP"] == [
        "127.0.0.1"]
    assert n["status"]["nodeInfo"]["kubeletVersion"] == "v1.35.4"
    assert n["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6")


def test_a_pod_without_the_toleration_is_kept_off_the_real_node(
    kube: client.ApiClient, namespace: str
) -> None:
    """Even a pod that selects the real node stays Pending without the toleration (the
    scheduler alone would rarely pick the 2-CPU real node over the kwok nodes' 64, so
    the taint is what keeps every other test's pods off it)."""
    pods: Any = client.CoreV1Api(kube)
    spec = real_pod("intruder")
    spec["spec"]["tolerations"] = []
    pods.create_namespaced_pod(namespace, spec)

    def unschedulable() -> Any:
        conditions = _pod(kube, namespace, "intruder").status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled"
                     and c.status == "False" and c.reason == "Unschedulable"), None)

    condition = wait_for("the scheduler to refuse the pod", unschedulable)
    assert "1 node(s) had untolerated taint(s)" in condition.message
    # every other node (the three kwok nodes, and any a benchmark added) does not match
    others = len(pods.list_node().items) - 1
    assert f"{others} node(s) didn't match Pod's node affinity/selector" in condition.message
    assert _pod(kube, namespace, "intruder").spec.node_name is None


def test_a_locked_down_pod_runs_and_serves_logs_and_exec_through_the_api_server(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    _start(kube, namespace, "locked")
    assert _pod(kube, namespace, "locked").spec.node_name == node.NODE_NAME

    def logs() -> str:
        return cluster.kubectl("logs", "-n", namespace, "locked", check=False).stdout

    assert f"hello from uid {UID}" in wait_for("a line in kubectl logs", logs)

    who = cluster.kubectl("exec", "-n", namespace, "locked", "--", "id", "-u")
    assert who.stdout.strip() == str(UID)
    caps = cluster.kubectl("exec", "-n", namespace, "locked", "--",
                           "grep", "^CapEff", "/proc/self/status")
    assert caps.stdout.split() == ["CapEff:", "0000000000000000"]
    write = cluster.kubectl("exec", "-n", namespace, "locked", "--", "touch", "/x", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    # hostNetwork: the pod sees the host's loopback; the pod-bound token is mounted.
    token = cluster.kubectl("exec", "-n", namespace, "locked", "--", "cat",
                            "/var/run/secrets/kubernetes.io/serviceaccount/token")
    assert token.stdout.count(".") == 2


def test_a_sigkilled_container_is_restarted_by_the_kubelet(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    status = _start(kube, namespace, "crashy")
    assert status.restart_count == 0
    pid = _task_pid(cluster, status.container_id)

    os.kill(pid, signal.SIGKILL)

    def restarted() -> Any:
        s = _running(kube, namespace, "crashy")
        return s if s is not None and s.restart_count == 1 else None

    after = wait_for("restartCount 1 and running again", restarted, timeout=60)
    assert after.last_state.terminated.exit_code == 137
    assert after.container_id != status.container_id
    assert _task_pid(cluster, after.container_id) != pid


def test_deleting_a_pod_sends_sigterm_to_its_container(
    kube: client.ApiClient, namespace: str
) -> None:
    pods: Any = client.CoreV1Api(kube)
    _start(kube, namespace, "graceful", finalizers=[HOLD])
    pods.delete_namespaced_pod("graceful", namespace)

    def terminated() -> Any:
        statuses = _pod(kube, namespace, "graceful").status.container_statuses or []
        return statuses[0].state.terminated if statuses else None

    try:
        done = wait_for("the container to terminate", terminated, timeout=60)
        assert done.message.strip() == "got SIGTERM"
        assert done.exit_code == 0
    finally:
        pods.patch_namespaced_pod("graceful", namespace, {"metadata": {"finalizers": None}})


def test_a_native_sidecar_gets_sigterm_after_the_main_container_exits(
    kube: client.ApiClient, namespace: str
) -> None:
    """The chart's sidecar is a native sidecar (an init container with restartPolicy
    Always): it starts first, and on delete stops only after the app container."""
    pods: Any = client.CoreV1Api(kube)
    spec = real_pod("with-sidecar", finalizers=[HOLD])
    spec["spec"]["shareProcessNamespace"] = True  # the sidecar looks for main's process
    main = spec["spec"]["containers"][0]
    main["command"] = [*main["command"], "main-marker"]  # $0 of main's shell
    on_term = ('if ps | grep -q "[m]ain-marker"; then echo "main still running"; '
               'else echo "got SIGTERM after main"; fi > /dev/termination-log; exit 0')
    sidecar = {**main, "name": "sidecar", "restartPolicy": "Always",
               "command": ["/bin/sh", "-c", f"trap '{on_term}' TERM; "
                           "while true; do sleep 0.1; done"]}
    spec["spec"]["initContainers"] = [sidecar]
    pods.create_namespaced_pod(namespace, spec)
    wait_for("main running and Ready", lambda: _running(kube, namespace, "with-sidecar"),
             timeout=90)
    pods.delete_namespaced_pod("with-sidecar", namespace)

    def both_terminated() -> Any:
        status = _pod(kube, namespace, "with-sidecar").status
        states = [s.state.terminated for s in [*(status.init_container_statuses or []),
                                                *(status.container_statuses or [])]]
        return states if len(states) == 2 and all(states) else None

    try:
        side, app = wait_for("both containers to terminate", both_terminated, timeout=60)
        assert app.message.strip() == "got SIGTERM"
        assert side.message.strip() == "got SIGTERM after main"
        assert side.finished_at >= app.finished_at
    finally:
        pods.patch_namespaced_pod("with-sidecar", namespace, {"metadata": {"finalizers": None}})


def _heartbeat(cluster: Cluster) -> str:
    n = node.get_node(cluster) or {}
    return next((str(c["lastHeartbeatTime"]) for c in n.get("status", {}).get("conditions", [])
                 if c["type"] == "Ready"), "")


def test_a_restarted_kubelet_keeps_the_loopback_address_and_the_running_container(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    before = _start(kube, namespace, "survivor")
    beat = _heartbeat(cluster)

    cluster.stop_component("kubelet")
    ensure_up(state_dir=cluster.state_dir)
    # The kubelet's first status report after its start runs every status setter.
    wait_for("a status report of the new kubelet", lambda: _heartbeat(cluster) != beat,
             timeout=60)

    n = node.get_node(cluster)
    assert n is not None and node.is_ready(n)
    assert [a for a in n["status"]["addresses"] if a["type"] == "InternalIP"] == [
        {"type": "InternalIP", "address": "127.0.0.1"}]
    after = wait_for("the pod Ready again", lambda: _running(kube, namespace, "survivor"))
    assert after.container_id == before.container_id and after.restart_count == 0


@pytest.mark.slow
def test_cluster_down_leaves_no_process_mount_or_cgroup_behind(cluster: Cluster) -> None:
    """A throwaway cluster of its own (other state dir, ports, cgroupRoot, socket) with a
    pod running on its real node, then `stop`: nothing of it is left on the host."""
    # a short base, not tmp_path: the kubelet's sockets live under the state dir, and a Unix
    # socket path over 107 bytes cannot be bound (pytest's numbered dirs grow with runs)
    base = Path(tempfile.mkdtemp(prefix="kg-", dir="/tmp"))
    state = base / "cluster"
    extra = ensure_up(state_dir=state, who="pytest")
    try:
        cgroup = node.cgroup_root(state)
        assert cgroup != node.cgroup_root(cluster.state_dir)
        extra.kubectl("create", "-f", "-", input=json.dumps(real_pod("p")))
        extra.kubectl("wait", "--for=condition=Ready", "pod/p", "--timeout=90s")
        records = extra.records()
        pids = {r.pid for r in records.values()} | hostclean.cgroup_pids(cgroup)
        shims = hostclean.pids_with_arg_pair("-address", str(node.containerd_address(state)))
        assert shims and hostclean.cgroup_pids(cgroup)
        assert any("/kubelet/" in m for m in hostclean.mounts_under(state))  # token tmpfs
        assert any(m.endswith("/rootfs") for m in hostclean.mounts_under(state))  # overlay
        assert hostclean.cgroup_dirs(cgroup)
    finally:
        stopped = stop(state_dir=state)

    assert {"kubelet", "containerd", "kube-apiserver", "etcd"} <= set(stopped)
    assert [p for p in pids | set(shims) if _runs(p)] == []
    assert hostclean.mounts_under(base) == []
    assert hostclean.cgroup_dirs(cgroup) == []
    assert not state.exists()
    links = [p for p in node.CONTAINER_LOG_LINKS.glob("*")
             if p.is_symlink() and str(base) in os.readlink(p)]
    assert links == []
    base.rmdir()  # empty: stop() removed the state dir
