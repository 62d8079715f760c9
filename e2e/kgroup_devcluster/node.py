"""The real node beside the kwok nodes: containerd + runc (Debian's packages) and a kubelet
built from the pinned Kubernetes module, all on 127.0.0.1, all state under `<state>/node/`.

Rule: pods land here only when they ask for it. The node is labelled `kgroup.dev/node=real`
and tainted `kgroup.dev/node=real:NoSchedule`; a pod for it carries `NODE_SELECTOR` and
`TOLERATION` (and `hostNetwork: true`: no pod network exists, so only the host's loopback
keeps every socket on 127.0.0.1). Everything else still goes to the kwok nodes.

How it is kept on loopback and apart from the rest of the machine:
- containerd has its own config, root, state, socket (`containerd_address()`) and runc
  root; its CRI stream server binds 127.0.0.1 on a random port; CNI has one loopback-only
  conflist; its sandbox image is a local `pause` (node_images.py: no registry here).
- the kubelet serves on 127.0.0.1 (TLS, x509 client CA + webhook authn/authz, no
  read-only port), its cgroups live under a cgroupRoot named after the state dir
  (`cgroup_root()`), and its pod logs under the state dir.
- The kubelet refuses a loopback `--node-ip`, and without one it would resolve the node
  name through the VM's DNS or publish eth0's address. It runs with
  `--cloud-provider=external`, so it publishes only its host name and never touches
  addresses that are set; `ensure_ready` then plays the cloud controller: InternalIP
  127.0.0.1 in the node's status, the `uninitialized` taint removed. The API server
  reaches it with `--kubelet-preferred-address-types=InternalIP` and checks its serving
  certificate (cluster CA, SAN 127.0.0.1).
- The kubelet sets a few kernel settings at start (`vm.overcommit_memory`,
  `kernel.panic`, ...; it has no option to leave them alone): their values before are
  saved in /run and restored when the last kgroup kubelet of the machine stops.

`stop` (from `make cluster-down`) stops the kubelet, deletes every task through
containerd, stops containerd, then removes what is left: processes in our cgroup subtree,
shims started with our socket, mounts under `<state>/node`, the cgroup subtree in every
hierarchy, our pods' links in /var/log/containers (see hostclean.py), and the empty
directories the kubelet and the shims made in /var/lib/kubelet and /run/containerd.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import hostclean, node_images, processes
from .pki import ensure_kubelet_pki, kubeconfig_text

if TYPE_CHECKING:
    from .cluster import Cluster

NODE_NAME = "kgroup-node"
LABEL_KEY, LABEL_VALUE = "kgroup.dev/node", "real"
NODE_SELECTOR = {LABEL_KEY: LABEL_VALUE}
TAINT = {"key": LABEL_KEY, "value": LABEL_VALUE, "effect": "NoSchedule"}
TOLERATION = {"key": LABEL_KEY, "operator": "Equal", "value": LABEL_VALUE,
              "effect": "NoSchedule"}
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"

COMPONENTS = ("containerd", "kubelet")  # start order, after the control plane and kwok
PORTS = ("kubelet", "kubelet_healthz")
CONTAINERD = "/usr/bin/containerd"
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # fixed in the kubelet's code
# Also fixed in the kubelet's code, whatever its --root-dir: the device plugins' socket.
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
# Directories the kubelet, containerd's shims and ctr create outside the state dir; removed
# at `down` when empty (rmdir never removes what another runtime still keeps there).
HOST_DIRS = ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet", "/var/log/containers",
             "/run/containerd/fifo", "/run/containerd/runc/k8s.io", "/run/containerd/runc",
             "/run/containerd/s", "/run/containerd")
SYSCTL_RECORD = Path("/run/kgroup-kubelet-sysctl.json")
KUBELET_SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic",
                   "kernel.panic_on_oops", "kernel.keys.root_maxkeys",
                   "kernel.keys.root_maxbytes")
READY_TIMEOUT = 120.0


class NodeError(RuntimeError):
    """The real node could not be started, reached or cleaned up; the message says why."""


# ---- where things are --------------------------------------------------------------------------


def node_dir(state_dir: Path) -> Path:
    return state_dir / "node"


def containerd_address(state_dir: Path | None = None) -> Path:
    """The Unix socket of the node's containerd (`ctr --address`); default: the cluster
    of this checkout (`<repo>/.state/cluster`, moved by KGROUP_STATE_ROOT)."""
    if state_dir is None:
        from .cluster import STATE_DIR  # cluster.py imports this module
        state_dir = STATE_DIR
    return node_dir(state_dir) / "containerd.sock"


def import_image(archive: Path, state_dir: Path | None = None) -> None:
    """Load an image archive (docker-archive or OCI tar) into the node's containerd, where
    the kubelet finds it (pods use `imagePullPolicy: Never` or `IfNotPresent`)."""
    node_images.import_image(archive, containerd_address(state_dir))


def image_names(state_dir: Path | None = None) -> set[str]:
    """The images the node's containerd holds for the kubelet (to skip an import)."""
    return node_images.image_names(containerd_address(state_dir))


def task_pid(container_id: str, state_dir: Path | None = None) -> int | None:
    """The host PID of a running container's first process (`containerd://<id>` or <id>)."""
    cid = container_id.removeprefix("containerd://")
    out = subprocess.run([node_images.CTR, "--address", str(containerd_address(state_dir)),
                          "--namespace", node_images.NAMESPACE, "tasks", "list"],
                         capture_output=True, text=True, check=False, timeout=60.0)
    for line in out.stdout.splitlines()[1:]:
        task, pid, status = line.split()
        if task == cid and status == "RUNNING":
            return int(pid)
    return None


def cgroup_root(state_dir: Path) -> str:
    """The kubelet's cgroupRoot: one per state dir, so two clusters never share one."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"/kgroup-{digest}"


def _paths(state_dir: Path) -> dict[str, Path]:
    n = node_dir(state_dir)
    return {
        "containerd_config": n / "containerd" / "config.toml",
        "containerd_root": n / "containerd" / "root",
        "containerd_state": n / "containerd" / "state",
        "runc_root": n / "containerd" / "runc",
        "cni_conf_dir": n / "cni",
        "kubelet_config": n / "kubelet.yaml",
        "kubelet_kubeconfig": n / "kubelet.kubeconfig",
        "kubelet_root": n / "kubelet",
        "pod_logs": n / "pod-logs",
        "volume_plugins": n / "volume-plugins",
    }


# ---- configuration -------------------------------------------------------------------------


def _containerd_config(state_dir: Path) -> str:
    p = _paths(state_dir)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{p['containerd_root']}"
state = "{p['containerd_state']}"
# Plugins that would look at the host (or need what it lacks) and serve no purpose here.
disabled_plugins = ["io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{containerd_address(state_dir)}"

[{cri}]
  sandbox_image = "{node_images.PAUSE_IMAGE}"
  # This VM lacks CAP_SYS_RESOURCE: without it runc fails every sandbox ("can't get
  # final child's PID from pipe: EOF") when asked for an OOM score below containerd's.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  enable_selinux = false

  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{p['runc_root']}"
        SystemdCgroup = false

  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{p['cni_conf_dir']}"
    max_conf_num = 1
"""


def _kubelet_config(cluster: Cluster) -> dict[str, Any]:
    p, pki = _paths(cluster.state_dir), cluster.pki
    never = "1%"  # eviction thresholds this shared disk never crosses by itself
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": cluster.ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": cluster.ports["kubelet_healthz"],
        "tlsCertFile": str(pki.kubelet_serving_cert),
        "tlsPrivateKeyFile": str(pki.kubelet_serving_key),
        "authentication": {"anonymous": {"enabled": False},
                           "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki.ca_cert)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{containerd_address(cluster.state_dir)}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(cluster.state_dir),
        "failCgroupV1": False,  # this host has v1 controllers (hybrid)
        "failSwapOn": False,
        "podLogsDir": str(p["pod_logs"]),
        "volumePluginDir": str(p["volume_plugins"]),
        "registerWithTaints": [TAINT],
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": never,
                         "nodefs.inodesFree": never, "imagefs.available": never,
                         "imagefs.inodesFree": never},
        # Image GC off: the images were imported by hand and cannot be pulled again.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "clusterDomain": "cluster.local",
        "maxPods": 110,
    }


def _cni_conflist() -> str:
    return json.dumps({"cniVersion": "0.4.0", "name": "kgroup-loopback",
                       "plugins": [{"type": "loopback"}]}, indent=2) + "\n"


def argv(cluster: Cluster, name: str) -> list[str]:
    p = _paths(cluster.state_dir)
    if name == "containerd":
        return [CONTAINERD, f"--config={p['containerd_config']}", "--log-level=warn"]
    if name == "kubelet":
        return [
            str(cluster.bin_dir / "kubelet"),
            f"--config={p['kubelet_config']}",
            f"--kubeconfig={p['kubelet_kubeconfig']}",
            f"--root-dir={p['kubelet_root']}",
            f"--cert-dir={p['kubelet_root'] / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-labels={LABEL_KEY}={LABEL_VALUE}",
            "--cloud-provider=external",  # addresses are ours to set: see the docstring
        ]
    raise ValueError(f"unknown node component {name!r}")


def missing_executables(bin_dir: Path) -> list[str]:
    """The node's executables that are not installed (scripts/setup.sh installs them)."""
    needed = [CONTAINERD, RUNC, node_images.CTR, f"{CNI_BIN_DIR}/loopback",
              "/usr/bin/containerd-shim-runc-v2", str(bin_dir / "kubelet")]
    return [x for x in needed if not os.access(x, os.X_OK)]


def prepare(cluster: Cluster, name: str) -> None:
    """Write what `name` reads at start (idempotent; the caller holds the state lock);
    nothing for a component that is not the node's."""
    s = cluster.state_dir
    p = _paths(s)
    if name == "containerd":
        sock = containerd_address(s)
        if len(str(sock)) > 100:  # sun_path holds 108 bytes
            raise NodeError(f"containerd socket path too long for a Unix socket: {sock}")
        for key in ("containerd_root", "containerd_state", "runc_root", "cni_conf_dir"):
            p[key].mkdir(parents=True, exist_ok=True)
        p["containerd_config"].write_text(_containerd_config(s))
        (p["cni_conf_dir"] / "10-loopback.conflist").write_text(_cni_conflist())
    elif name == "kubelet":
        pki = ensure_kubelet_pki(cluster.pki.dir, NODE_NAME)
        for key in ("kubelet_root", "pod_logs", "volume_plugins"):
            p[key].mkdir(parents=True, exist_ok=True)
        p["kubelet_config"].write_text(json.dumps(_kubelet_config(cluster), indent=2) + "\n")
        kc = p["kubelet_kubeconfig"]
        kc.touch(mode=0o600)
        kc.write_text(kubeconfig_text(server=cluster.server, ca=pki.ca_cert,
                                      cert=pki.client_cert("kubelet"),
                                      key=pki.client_key("kubelet"),
                                      user=f"system:node:{NODE_NAME}"))
        # The kubelet's cgroupRoot must exist in every hierarchy before it starts.
        hostclean.make_cgroup(cgroup_root(s))
        hostclean.save_sysctls(KUBELET_SYSCTLS, SYSCTL_RECORD)


def started(cluster: Cluster, name: str) -> None:
    """After `name` is healthy: containerd gets the node's own images (else nothing)."""
    if name == "containerd":
        node_images.ensure_base_images(containerd_address(cluster.state_dir))


def healthy(cluster: Cluster, name: str) -> bool:
    if name == "containerd":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(containerd_address(cluster.state_dir)))
            except OSError:
                return False
        return True
    url = f"http://127.0.0.1:{cluster.ports['kubelet_healthz']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5.0) as r:
            return int(r.status) == 200
    except (OSError, urllib.error.HTTPError):
        return False


# ---- registration -----------------------------------------------------------------------------


def get_node(cluster: Cluster) -> dict[str, Any] | None:
    status, body = cluster.request("GET", f"/api/v1/nodes/{NODE_NAME}")
    if status != 200:
        return None
    data: dict[str, Any] = json.loads(body)
    return data


def is_ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions", []))


def ensure_ready(cluster: Cluster, *, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    """Wait for the kubelet's Node, give it its loopback address, lift the external cloud
    provider's taint, and wait until it is Ready. Returns the Node."""
    deadline = time.monotonic() + timeout

    def wait(what: str) -> None:
        if time.monotonic() > deadline:
            log = cluster.log("kubelet")
            raise NodeError(f"timed out after {timeout:.0f} s waiting for {what}; "
                            f"log {log}")
        time.sleep(0.1)

    while (node := get_node(cluster)) is None:
        wait(f"node {NODE_NAME} to register")
    addresses = node.get("status", {}).get("addresses", [])
    if {"type": "InternalIP", "address": "127.0.0.1"} not in addresses:
        patch = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                          {"type": "Hostname", "address": NODE_NAME}]}}
        cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge",
                        "-p", json.dumps(patch))
    if any(t.get("key") == UNINITIALIZED_TAINT for t in node["spec"].get("taints", [])):
        cluster.kubectl("taint", "node", NODE_NAME, f"{UNINITIALIZED_TAINT}-")
    while not is_ready(node := get_node(cluster) or {}):
        wait(f"node {NODE_NAME} to be Ready")
    return node


# ---- teardown --------------------------------------------------------------------------------


def _ctr(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([node_images.CTR, "--address", str(containerd_address(state_dir)),
                           "--namespace", node_images.NAMESPACE, *args],
                          capture_output=True, text=True, check=False, timeout=60.0)


def stop(state_dir: Path, records: dict[str, processes.Record], *,
         grace: float = 10.0) -> list[str]:
    """Stop the node and remove what it put on the host. Returns the names stopped."""
    stopped = []
    kubelet, containerd = records.get("kubelet"), records.get("containerd")
    if kubelet is not None and processes.stop(kubelet, grace=grace):
        stopped.append("kubelet")
    if containerd is not None and processes.is_alive(containerd):
        # Through containerd first: it unmounts rootfs and shm, and each shim exits
        # (removing its socket in /run/containerd/s) once its tasks are deleted.
        tasks = _ctr(state_dir, "tasks", "list", "--quiet").stdout.split()
        if tasks:
            _ctr(state_dir, "tasks", "delete", "--force", *tasks)
    cgroup = cgroup_root(state_dir)
    hostclean.kill_cgroup(cgroup)
    if containerd is not None and processes.stop(containerd, grace=grace):
        stopped.append("containerd")
    hostclean.kill_pids(hostclean.pids_with_arg_pair("-address",
                                                     str(containerd_address(state_dir))))
    hostclean.unmount_all(node_dir(state_dir))
    hostclean.remove_cgroup(cgroup)
    logs = str(_paths(state_dir)["pod_logs"].resolve())
    if CONTAINER_LOG_LINKS.is_dir():
        for link in CONTAINER_LOG_LINKS.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(logs + "/"):
                link.unlink()
    if not hostclean.pids_named("kubelet"):  # the last kubelet of the machine is gone
        hostclean.restore_sysctls(SYSCTL_RECORD)
        DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
    for d in HOST_DIRS:
        with contextlib.suppress(OSError):
            os.rmdir(d)
    return stopped


def leftovers(state_dir: Path) -> list[str]:
    """What of the node is still on the host (empty after a clean `stop`)."""
    out = [f"process {p} in cgroup {cgroup_root(state_dir)}"
           for p in sorted(hostclean.cgroup_pids(cgroup_root(state_dir)))]
    out += [f"shim {p}" for p in hostclean.pids_with_arg_pair(
        "-address", str(containerd_address(state_dir)))]
    out += [f"mount {m}" for m in hostclean.mounts_under(node_dir(state_dir))]
    out += [f"cgroup {d}" for d in hostclean.cgroup_dirs(cgroup_root(state_dir))]
    return out
