"""The real node's configuration and host bookkeeping, checked without starting anything:
every listener on 127.0.0.1, every path under the state dir, the traps of this VM
answered (OOM score, cgroup driver, node address), teardown order of mounts.

The node itself running is tested in e2e/tests/test_real_node.py.
"""

from __future__ import annotations

import io
import json
import tarfile
import tomllib
from pathlib import Path
from typing import Any

from kgroup_devcluster import hostclean, node, node_images
from kgroup_devcluster.cluster import PORTS, Cluster

STATE = Path("/srv/kgroup-test/.state/cluster")


def _cluster() -> Cluster:
    return Cluster(state_dir=STATE, bin_dir=Path("/opt/bin"),
                   ports={name: 40000 + i for i, name in enumerate(PORTS)})


def _under_state(value: str) -> bool:
    return value.startswith(str(STATE) + "/")


def test_containerd_keeps_to_its_state_dir_and_loopback() -> None:
    config = tomllib.loads(node._containerd_config(STATE))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    runc = cri["containerd"]["runtimes"]["runc"]

    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE on this VM
    assert cri["stream_server_address"] == "127.0.0.1"
    assert cri["sandbox_image"] == node_images.PAUSE_IMAGE
    assert runc["options"]["SystemdCgroup"] is False
    assert runc["options"]["BinaryName"] == node.RUNC
    paths = [config["root"], config["state"], config["grpc"]["address"],
             runc["options"]["Root"], cri["cni"]["conf_dir"]]
    assert all(_under_state(p) for p in paths), paths
    assert config["grpc"]["address"] == str(node.containerd_address(STATE))


def test_the_kubelet_listens_on_loopback_only_with_authn_and_authz() -> None:
    c = _cluster()
    config = node._kubelet_config(c)

    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1"
    assert config["readOnlyPort"] == 0
    assert config["port"] == c.ports["kubelet"]
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authentication"]["webhook"]["enabled"] is True
    assert config["authentication"]["x509"]["clientCAFile"] == str(c.pki.ca_cert)
    assert config["authorization"]["mode"] == "Webhook"
    assert config["cgroupDriver"] == "cgroupfs" and config["failCgroupV1"] is False
    assert config["cgroupRoot"] == node.cgroup_root(STATE)
    assert config["registerWithTaints"] == [node.TAINT]
    assert _under_state(config["podLogsDir"]) and _under_state(config["volumePluginDir"])
    assert config["containerRuntimeEndpoint"] == f"unix://{node.containerd_address(STATE)}"


def test_the_kubelet_publishes_no_address_of_its_own() -> None:
    argv = node.argv(_cluster(), "kubelet")

    assert "--cloud-provider=external" in argv
    assert not any(a.startswith("--node-ip") for a in argv)
    assert f"--hostname-override={node.NODE_NAME}" in argv
    assert f"--node-labels={node.LABEL_KEY}={node.LABEL_VALUE}" in argv
    assert all(_under_state(a.split("=", 1)[1]) for a in argv
               if a.startswith(("--config=", "--kubeconfig=", "--root-dir=", "--cert-dir=")))


def test_the_apiserver_reaches_the_kubelet_at_its_internal_ip_and_checks_it() -> None:
    argv = _cluster().argv("kube-apiserver")

    assert "--kubelet-preferred-address-types=InternalIP" in argv
    assert any(a.startswith("--kubelet-certificate-authority=") for a in argv)
    assert any(a.startswith("--kubelet-client-certificate=") for a in argv)
    assert "--enable-admission-plugins=NodeRestriction" in argv


def test_each_state_dir_gets_its_own_cgroup_root() -> None:
    assert node.cgroup_root(STATE) == node.cgroup_root(STATE)
    assert node.cgroup_root(STATE) != node.cgroup_root(STATE.parent / "other")
    assert node.cgroup_root(STATE).startswith("/kgroup-")


def test_the_toleration_matches_the_taint() -> None:
    t = node.TOLERATION
    assert (t["key"], t["value"], t["effect"]) == (
        node.TAINT["key"], node.TAINT["value"], node.TAINT["effect"])
    assert node.NODE_SELECTOR == {node.LABEL_KEY: node.LABEL_VALUE}


MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
90 27 0:50 / /s/node/kubelet rw - ext4 /dev/vda rw
91 90 0:51 / /s/node/kubelet/pods/u/volumes/kubernetes.io~projected/kube\\040api rw - tmpfs tmpfs rw
92 27 0:52 / /s/node/containerd/state/t/abc/rootfs rw - overlay overlay rw,lowerdir=x
93 27 0:53 / /s/node/kubelet rw - ext4 /dev/vda rw
94 27 0:54 / /s/nodeX rw - tmpfs tmpfs rw
"""


def test_mounts_are_unmounted_deepest_first_and_stacked_ones_latest_first() -> None:
    mounts = hostclean.parse_mountinfo(MOUNTINFO)
    assert mounts[2] == ("/s/node/kubelet/pods/u/volumes/kubernetes.io~projected/kube api",
                         "tmpfs", "rw")

    order = hostclean.mounts_under(Path("/s/node"), mounts)

    assert order == [
        "/s/node/kubelet/pods/u/volumes/kubernetes.io~projected/kube api",
        "/s/node/containerd/state/t/abc/rootfs",
        "/s/node/kubelet",  # mounted last (93): the top of the stack
        "/s/node/kubelet",
    ]


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: (tar.extractfile(m) or io.BytesIO()).read() for m in tar.getmembers()}


def test_an_image_archive_is_deterministic_and_tagged(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF not really")
    entries = [node_images.Entry("bin/tool", source=binary),
               node_images.Entry("bin/sh", link="tool", mode=0o777)]
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    node_images.write_archive(a, name="localhost/kgroup/t:1", entries=entries,
                              entrypoint=["/bin/sh"])
    node_images.write_archive(b, name="localhost/kgroup/t:1", entries=entries,
                              entrypoint=["/bin/sh"])

    assert a.read_bytes() == b.read_bytes()
    members = _members(a)
    manifest: list[dict[str, Any]] = json.loads(members["manifest.json"])
    assert manifest[0]["RepoTags"] == ["localhost/kgroup/t:1"]
    config = json.loads(members[manifest[0]["Config"]])
    assert config["config"]["Entrypoint"] == ["/bin/sh"]
    with tarfile.open(fileobj=io.BytesIO(members[manifest[0]["Layers"][0]])) as layer:
        files = {m.name: m for m in layer.getmembers()}
    assert files["bin/sh"].issym() and files["bin/sh"].linkname == "tool"
    assert files["bin/tool"].isfile() and files["bin/tool"].uid == 0
