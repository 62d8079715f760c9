"""The local control plane: etcd, kube-apiserver, controller manager, scheduler, kwok,
and a real node (containerd + kubelet, see node.py).

Rule: every process listens on 127.0.0.1 only, on ports picked free at the first start
and recorded in `<state>/ports.json`, and is started detached with its log in
`<state>/logs/<name>.log`. Everything the cluster needs lives in the state dir
(`<repo>/.state/cluster/`): certificates, kubeconfigs, etcd's data, PIDs. `up` is
idempotent: it starts only what is not running (or runs an older command line), in
dependency order, and waits for each step before the next. `down` signals only the PIDs
recorded there (see processes.py) and removes what the real node left (node.py).

Why: tests need a real API server (admission, RBAC, CEL, TokenRequest, resourceVersion
conflicts); kwok plays the kubelet for cheap fake nodes (pods become Running and Ready,
nothing runs in them), and the real node runs the pods that ask for it in containers.

A file lock (`<repo>/.state/cluster.lock`) serialises `up`, `down` and the API server
restarts of every process on the machine: several engineers share this working tree.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import node, processes
from .pki import FRONT_PROXY_CLIENT, Pki, ensure_pki, kubeconfig_text

REPO = Path(__file__).resolve().parents[2]
STATE_ROOT = Path(os.environ.get("KGROUP_STATE_ROOT", REPO / ".state"))
STATE_DIR = STATE_ROOT / "cluster"
LOCK_FILE = STATE_ROOT / "cluster.lock"

# Start order; stop goes the other way. The real node (node.py) comes last.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
              *node.COMPONENTS)
PORTS = ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok",
         *node.PORTS)

FAKE_NODES = ("kwok-node-0", "kwok-node-1", "kwok-node-2")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
PODS_PER_NODE = 250
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT = 240.0  # seconds; the machine may be busy with a Go build


class ClusterError(RuntimeError):
    """The control plane could not be brought up or reached; the message says why."""


def _say(msg: str) -> None:
    print(f"[devcluster] {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    """Hold the machine-wide lock on the cluster's state (blocking)."""
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_tools() -> Path:
    """Run scripts/build-tools.sh (a no-op when cached) and return the bin dir."""
    override = os.environ.get("KGROUP_BIN_DIR")
    if override:
        return Path(override)
    script = REPO / "scripts" / "build-tools.sh"
    result = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"{script} failed with exit code {result.returncode}")
    lines = result.stdout.strip().splitlines()
    if not lines:
        raise ClusterError(f"{script} printed no bin dir")
    return Path(lines[-1])


@dataclass
class Cluster:
    """Handle on the control plane described by a state dir (running or not)."""

    state_dir: Path
    bin_dir: Path
    ports: dict[str, int]

    # ---- paths and addresses -------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pids_file(self) -> Path:
        return self.state_dir / "pids.json"

    def component_kubeconfig(self, stem: str) -> Path:
        return self.state_dir / f"{stem}.kubeconfig"

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    # ---- commands --------------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run kubectl as cluster admin; output captured as text."""
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def helm(self, *args: str, check: bool = True,
             timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run helm as cluster admin, with its caches inside the state dir."""
        home = self.state_dir / "helm"
        env = dict(os.environ)
        env.update(
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
            KUBECONFIG=str(self.kubeconfig),
        )
        argv = [str(self.bin_dir / "helm"), f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(argv, capture_output=True, text=True, check=check,
                              env=env, timeout=timeout)

    # ---- talking to the API server directly (no client library needed) ----------------

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.client_cert("admin")), str(self.pki.client_key("admin")))
        return ctx

    def request(self, method: str, path: str, body: Any = None,
                timeout: float = 10.0) -> tuple[int, bytes]:
        """One HTTPS request to the API server as admin; returns (status, body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ssl_context(), timeout=timeout) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())

    def apiserver_metrics(self) -> str:
        """GET /metrics of the API server as admin (Prometheus text)."""
        status, body = self.request("GET", "/metrics", timeout=30.0)
        if status != 200:
            raise ClusterError(f"GET /metrics: HTTP {status}: {body[:200]!r}")
        return body.decode()

    def apiserver_ready(self) -> bool:
        try:
            status, _ = self.request("GET", "/readyz", timeout=5.0)
        except OSError:
            return False
        return status == 200

    # ---- processes ---------------------------------------------------------------------------

    def records(self) -> dict[str, processes.Record]:
        return processes.load_records(self.pids_file)

    def status(self) -> dict[str, tuple[processes.Record | None, bool]]:
        """Each component's record (or None) and whether it is alive."""
        records = self.records()
        out: dict[str, tuple[processes.Record | None, bool]] = {}
        for name in COMPONENTS:
            rec = records.get(name)
            out[name] = (rec, rec is not None and processes.is_alive(rec))
        return out

    def all_alive(self) -> bool:
        return all(alive for _, alive in self.status().values())

    def argv(self, name: str) -> list[str]:
        """The command line of a component (deterministic for a given state dir)."""
        if name in node.COMPONENTS:
            return node.argv(self, name)
        p, s, pki = self.ports, self.state_dir, self.pki
        exe = str(self.bin_dir / name)
        if name == "etcd":
            client = f"http://127.0.0.1:{p['etcd_client']}"
            peer = f"http://127.0.0.1:{p['etcd_peer']}"
            return [
                exe, "--name=kgroup", f"--data-dir={s / 'etcd'}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=kgroup={peer}", "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",  # a throwaway dev cluster: speed over durability
                "--log-level=warn",
            ]
        if name == "kube-apiserver":
            return [
                exe,
                f"--etcd-servers=http://127.0.0.1:{p['etcd_client']}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={p['apiserver']}", "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki.apiserver_cert}",
                f"--tls-private-key-file={pki.apiserver_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                "--profiling=false",
                # Without it, SIGTERM waits 60 s for the clients' watches to end by themselves.
                "--shutdown-watch-termination-grace-period=2s",
                f"--cert-dir={s / 'pki' / 'apiserver-generated'}",
                f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
                f"--proxy-client-key-file={pki.front_proxy_client_key}",
                # The real node: dialled at its InternalIP (127.0.0.1), certificate checked.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki.client_cert('apiserver-kubelet-client')}",
                f"--kubelet-client-key={pki.client_key('apiserver-kubelet-client')}",
                f"--kubelet-certificate-authority={pki.ca_cert}",
                "--enable-admission-plugins=NodeRestriction",
            ]
        if name in ("kube-controller-manager", "kube-scheduler"):
            stem = "controller-manager" if name == "kube-controller-manager" else "scheduler"
            port = p["controller_manager"] if stem == "controller-manager" else p["scheduler"]
            kc = self.component_kubeconfig(stem)
            common = [
                exe, f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1",
                f"--secure-port={port}", f"--cert-dir={s / 'pki' / (stem + '-generated')}",
                # One instance only: no election, so a restart does not wait out a lease.
                "--leader-elect=false", "--profiling=false",
            ]
            if name == "kube-scheduler":
                return common
            return [
                *common,
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                # kwok renews the fake nodes' leases through the API server: while a test
                # keeps the API server down, nodes must not turn Unknown and get their pods
                # evicted (the default grace is 50 s).
                "--node-monitor-grace-period=600s",
                # The default set minus the controllers that need a cloud provider.
                "--controllers=*,-cloud-node-lifecycle-controller,-node-route-controller,"
                "-service-lb-controller",
            ]
        if name == "kwok":
            return [
                exe, f"--kubeconfig={self.component_kubeconfig('kwok')}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{p['kwok']}",
                # Fake addresses for nodes and pods: written into status, never connected to.
                "--node-ip=10.244.0.1", "--cidr=10.244.0.1/16",
                "--node-lease-duration-seconds=40",
            ]
        raise ValueError(f"unknown component {name!r}")

    def _wait(self, what: str, ready: Callable[[], bool], *, name: str | None = None,
              timeout: float = START_TIMEOUT) -> None:
        """Poll `ready` until true; fail early if the component's process died."""
        deadline = time.monotonic() + timeout
        while True:
            if ready():
                return
            if name is not None:
                rec = self.records().get(name)
                if rec is None or not processes.is_alive(rec):
                    raise ClusterError(f"{name} exited while waiting for {what}; "
                                       f"log {self.log(name)}:\n{_tail(self.log(name))}")
            if time.monotonic() > deadline:
                where = f"; log {self.log(name)}:\n{_tail(self.log(name))}" if name else ""
                raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{where}")
            time.sleep(0.25)

    def _healthy(self, name: str) -> bool:
        """The component's own health endpoint answers 200 (certificate not checked:
        the controller manager and scheduler serve a self-signed one on loopback)."""
        if name in node.COMPONENTS:
            return node.healthy(self, name)
        if name == "etcd":
            url = f"http://127.0.0.1:{self.ports['etcd_client']}/health"
            ctx = None
        elif name == "kube-apiserver":
            return self.apiserver_ready()
        else:
            port = {"kube-controller-manager": self.ports["controller_manager"],
                    "kube-scheduler": self.ports["scheduler"],
                    "kwok": self.ports["kwok"]}[name]
            scheme = "http" if name == "kwok" else "https"
            url = f"{scheme}://127.0.0.1:{port}/healthz"
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, timeout=5.0, context=ctx) as r:
                return int(r.status) == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def start_component(self, name: str) -> processes.Record:
        """Start one component (the caller holds the state lock) and wait until healthy."""
        ensure_pki(self.pki.dir)  # a state dir from an older version may lack a file
        argv = self.argv(name)
        node.prepare(self, name)  # the real node's configs, cgroups, ... (else nothing)
        rec = processes.start(name, argv, log=self.log(name), cwd=self.state_dir)
        records = self.records()
        records[name] = rec
        processes.save_records(self.pids_file, records)
        self._wait(f"{name} to be healthy", lambda: self._healthy(name), name=name)
        node.started(self, name)
        _say(f"{name} running (pid {rec.pid}, log {self.log(name)})")
        return rec

    def stop_component(self, name: str, *, grace: float = 10.0) -> None:
        rec = self.records().get(name)
        if rec is not None:
            processes.stop(rec, grace=grace)

    # ---- robustness helpers for tests ------------------------------------------------------

    def stop_apiserver(self) -> None:
        """Stop the API server (etcd and the rest keep running)."""
        with state_lock():
            self.stop_component("kube-apiserver")

    def start_apiserver(self) -> None:
        """Start the API server again on the same port with the same etcd; wait for /readyz
        and for the fake nodes to be Ready."""
        with state_lock():
            rec = self.records().get("kube-apiserver")
            if rec is None or not processes.is_alive(rec):
                self.start_component("kube-apiserver")
            self.wait_usable()

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    # ---- nodes --------------------------------------------------------------------------------

    def ensure_nodes(self, names: Iterable[str] = FAKE_NODES) -> None:
        """Create the fake nodes kwok manages (existing ones are kept)."""
        resources = {"cpu": "64", "memory": "256Gi", "pods": str(PODS_PER_NODE),
                     "ephemeral-storage": "1Ti"}
        for name in names:
            manifest = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                               "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
                },
                "spec": {},
                "status": {
                    "allocatable": resources, "capacity": resources,
                    "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                 "kubeletVersion": "fake", "kubeProxyVersion": "fake"},
                },
            }
            status, body = self.request("POST", "/api/v1/nodes", manifest)
            if status not in (201, 409):
                raise ClusterError(f"creating node {name}: HTTP {status}: {body[:300]!r}")

    def ensure_pod_capacity(self, pods: int) -> None:
        """Enough fake nodes for ``pods`` more pods than the three standing nodes hold
        (a benchmark's 1,000 members): extra ones are added, never removed (they cost
        nothing while no pod runs on them)."""
        extra = -(-max(0, pods - PODS_PER_NODE) // PODS_PER_NODE)
        self.ensure_nodes(f"kwok-node-{len(FAKE_NODES) + i}" for i in range(extra))

    def _get_json(self, path: str) -> dict[str, Any] | None:
        try:
            status, body = self.request("GET", path)
        except OSError:
            return None
        if status != 200:
            return None
        data: dict[str, Any] = json.loads(body)
        return data

    def nodes_ready(self) -> bool:
        data = self._get_json("/api/v1/nodes?labelSelector=type%3Dkwok")
        if data is None:
            return False
        ready = {
            item["metadata"]["name"]
            for item in data.get("items", [])
            for cond in item.get("status", {}).get("conditions", [])
            if cond.get("type") == "Ready" and cond.get("status") == "True"
        }
        return ready >= set(FAKE_NODES)

    def default_service_account_exists(self) -> bool:
        return self._get_json("/api/v1/namespaces/default/serviceaccounts/default") is not None

    def wait_usable(self) -> None:
        self._wait("the fake nodes to be Ready", self.nodes_ready, name="kwok")
        self._wait("the default ServiceAccount", self.default_service_account_exists,
                   name="kube-controller-manager")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# ---- the state dir --------------------------------------------------------------------------


def _meta_file(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def load(state_dir: Path = STATE_DIR) -> Cluster | None:
    """The cluster described by `state_dir`, or None when there is no state."""
    try:
        meta = json.loads(_meta_file(state_dir).read_text())
        ports = json.loads((state_dir / "ports.json").read_text())
    except FileNotFoundError:
        return None
    return Cluster(state_dir=state_dir, bin_dir=Path(meta["bin_dir"]),
                   ports={k: int(v) for k, v in ports.items()})


def running(state_dir: Path = STATE_DIR) -> Cluster | None:
    """The cluster if every one of its processes is alive, else None."""
    c = load(state_dir)
    return c if c is not None and c.all_alive() else None


def get_owner(state_dir: Path = STATE_DIR) -> str | None:
    """Who asked for the cluster: "cli" (make cluster-up) or "pytest"."""
    try:
        return str(json.loads(_meta_file(state_dir).read_text()).get("owner"))
    except FileNotFoundError:
        return None


def set_owner(who: str, state_dir: Path = STATE_DIR) -> None:
    path = _meta_file(state_dir)
    meta = json.loads(path.read_text())
    meta["owner"] = who
    path.write_text(json.dumps(meta, indent=2) + "\n")


def _prepare(state_dir: Path, bin_dir: Path, who: str) -> Cluster:
    """Create the state dir's files that are missing (ports, certificates, kubeconfigs)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)
    ports_file = state_dir / "ports.json"
    ports: dict[str, int] = {}
    if ports_file.exists():
        ports = {k: int(v) for k, v in json.loads(ports_file.read_text()).items()}
    for name in PORTS:  # a state dir from an older version may lack some
        while name not in ports or list(ports.values()).count(ports[name]) > 1:
            ports[name] = _free_port()
    ports_file.write_text(json.dumps(ports, indent=2) + "\n")
    meta = {"bin_dir": str(bin_dir), "owner": who}
    _meta_file(state_dir).write_text(json.dumps(meta, indent=2) + "\n")
    cluster = Cluster(state_dir=state_dir, bin_dir=bin_dir, ports=ports)
    pki = ensure_pki(cluster.pki.dir)
    for stem, path in [("admin", cluster.kubeconfig)] + [
        (s, cluster.component_kubeconfig(s)) for s in ("controller-manager", "scheduler", "kwok")
    ]:
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(kubeconfig_text(
                server=cluster.server, ca=pki.ca_cert, cert=pki.client_cert(stem),
                key=pki.client_key(stem), user=stem))
    return cluster


def ensure_up(*, state_dir: Path = STATE_DIR, who: str = "pytest",
              _register: processes.Record | None = None) -> Cluster:
    """Start whatever is not running and return the cluster once it is usable.

    `who` is recorded as the owner; "cli" sticks (a cluster `make cluster-up` asked for
    stays up after test sessions end).
    """
    bin_dir = build_tools()
    missing = node.missing_executables(bin_dir) + [
        n for n in COMPONENTS if n not in node.COMPONENTS and not (bin_dir / n).exists()]
    if missing:
        raise ClusterError(f"missing binaries in {bin_dir}: {', '.join(missing)}")
    with state_lock():
        existing = load(state_dir)
        if existing is not None and existing.all_alive():
            if who == "cli":
                set_owner("cli", state_dir)
            _register_user(state_dir, _register)
            return existing
        if existing is not None and get_owner(state_dir) == "cli":
            who = "cli"
        cluster = _prepare(state_dir, bin_dir, who)
        status = cluster.status()
        for name, (rec, alive) in status.items():
            if alive and rec is not None and rec.argv != tuple(cluster.argv(name)):
                _say(f"{name} runs with an older command line: restarting it")
                cluster.stop_component(name)
                status[name] = (rec, False)
        for name, (_, alive) in status.items():
            port = _port_of(cluster, name)
            if not alive and port is not None and not _port_is_free(port):
                raise ClusterError(f"port {port} for {name} is taken by a process this tool "
                                   f"did not start; run `python -m kgroup_devcluster down`")
        for name, (_, alive) in status.items():
            if not alive:
                cluster.start_component(name)
        cluster.ensure_nodes()
        cluster.wait_usable()
        node.ensure_ready(cluster)
        _register_user(state_dir, _register)
        return cluster


def _register_user(state_dir: Path, user: processes.Record | None) -> None:
    if user is not None:
        users = users_dir(state_dir)
        users.mkdir(exist_ok=True)
        processes.save_record(users / f"{user.pid}.json", user)


def _port_of(cluster: Cluster, name: str) -> int | None:
    """The component's listening port; None for containerd (a Unix socket)."""
    key = {"kube-apiserver": "apiserver", "kube-controller-manager": "controller_manager",
           "kube-scheduler": "scheduler", "etcd": "etcd_client"}.get(name, name)
    return cluster.ports.get(key)


def stop(*, state_dir: Path = STATE_DIR, grace: float = 10.0) -> list[str]:
    """Stop the processes recorded in the state dir, then remove it. Returns their names."""
    with state_lock():
        return stop_locked(state_dir, grace)


def stop_locked(state_dir: Path, grace: float) -> list[str]:
    """stop() for a caller that already holds state_lock()."""
    records = processes.load_records(state_dir / "pids.json")
    stopped = node.stop(state_dir, records, grace=grace)  # first: its pods need nothing else
    for name in reversed(COMPONENTS):
        rec = records.get(name)
        if rec is not None and processes.stop(rec, grace=grace):
            stopped.append(name)
    left = node.leftovers(state_dir)
    if left:  # never rmtree over a live mount: it would delete what is mounted there
        raise ClusterError(f"the real node left {'; '.join(left)}; {state_dir} is kept")
    shutil.rmtree(state_dir, ignore_errors=True)
    return stopped


def users_dir(state_dir: Path) -> Path:
    """Where test sessions register while they use the cluster (see sessions.py)."""
    return state_dir / "users"
