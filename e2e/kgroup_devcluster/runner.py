"""The local pod runner: plays the container runtime for pods that kwok marks Running.

kwok makes pods Running without running anything, so on the local control plane this
runner starts, as local processes, the containers of every pod it is told to watch
(except the pods on the real node, whose kubelet runs them in real containers):

- it runs a container's ``command`` + ``args`` (the image is ignored; executables resolve
  against the project's virtualenv first), native sidecars (init containers with
  ``restartPolicy: Always``) included; a container without a ``command`` is skipped;
- each process acts as the pod: its ``KUBECONFIG`` holds a TokenRequest token for the pod's
  service account *bound to that pod*, never the admin's, so RBAC and the admission policy
  see the pod's identity; only in the containers the kubelet would give the token to (a
  mount at the service-account path, or the pod's automount not turned off): the chart's
  worker pods turn it off and mount a projected token into the sidecar alone, so the app
  process gets no ``KUBECONFIG`` at all;
- the sidecar's API: in a real pod a Unix socket in an emptyDir shared by the sidecar and
  the app (the chart's default). Here each pod gets its own socket in its state dir
  (named by the pod's uid, as a new pod gets a new emptyDir), and ``KGROUP_LISTEN`` and
  ``KGROUP_SIDECAR_URL`` point at it whatever the pod spec says (the one place where the
  local run differs from a real pod); when that path is too long for a Unix socket
  (about 107 bytes), in a short directory of the runner's under /tmp instead (removed
  when the runner stops);
- a container that exits while its pod is still Running is restarted with back-off, as
  the kubelet does for ``restartPolicy: Always``;
- when the pod is deleted (or gets a deletionTimestamp) its processes get SIGTERM, then
  SIGKILL after ``terminationGracePeriodSeconds``.

Everything listens on and connects to 127.0.0.1: processes reach the API server at its
loopback URL, never at a Service or pod IP. The runner writes ``runner.json`` (pod → pids,
sidecar URL, log files) into its state directory so tests and chaos tools can signal a pod's
processes the way a crash would.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from .node import NODE_NAME as REAL_NODE

log = logging.getLogger("kgroup.runner")

RESTART_BACKOFF_MAX = 10.0


SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, its terminating NUL included


def sidecar_url(listen: str) -> str:
    """KGROUP_SIDECAR_URL for a KGROUP_LISTEN value."""
    return listen if listen.startswith("unix://") else f"http://{listen}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Container:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    sidecar: bool = False  # a native sidecar: stopped after the app containers
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0


@dataclass
class RunningPod:
    namespace: str
    name: str
    uid: str
    listen: str  # KGROUP_LISTEN of the pod: unix:///... or 127.0.0.1:<port>
    grace: float
    containers: list[Container] = field(default_factory=list)
    terminating_since: float | None = None
    sidecars_signalled: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class LocalRunner:
    """Watches pods in `namespaces` and keeps their containers running as processes."""

    def __init__(
        self,
        *,
        kubeconfig: str,
        namespaces: list[str],
        state_dir: Path,
        extra_env: dict[str, str],
        venv_bin: Path,
        token_writer: TokenWriter,
        audit_dir: Path | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.state_dir = state_dir
        self.extra_env = extra_env
        self.venv_bin = venv_bin
        self.token_writer = token_writer
        self.audit_dir = audit_dir
        self.pods: dict[str, RunningPod] = {}
        self.socket_dir: Path | None = None  # for socket paths too long in the state dir
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(api)

    # -- pod events ----------------------------------------------------------------
    def on_pod(self, event_type: str, pod: Any) -> None:
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        with self.lock:
            running = self.pods.get(key)
            gone = event_type == "DELETED" or pod.metadata.deletion_timestamp is not None
            if running is not None and running.uid != pod.metadata.uid:
                self._terminate(running)  # same name, new pod: the old one is gone
                running = None
            if gone:
                if running is not None:
                    self._terminate(running)
                return
            if running is None and pod.status is not None and pod.status.phase == "Running" \
                    and pod.spec.node_name != REAL_NODE:
                self._start(pod)  # the real node's kubelet runs its pods' containers itself

    def _start(self, pod: Any) -> None:
        ns, name = pod.metadata.namespace, pod.metadata.name
        spec = pod.spec
        sidecars = [
            c for c in (spec.init_containers or [])
            if getattr(c, "restart_policy", None) == "Always"
        ]
        runnable = [c for c in [*sidecars, *(spec.containers or [])] if c.command]
        if not runnable:
            return
        pod_dir = self.state_dir / "pods" / f"{ns}_{name}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        kubeconfig = pod_dir / "kubeconfig"
        try:
            self.token_writer(
                namespace=ns,
                service_account=spec.service_account_name or "default",
                pod_name=name,
                pod_uid=pod.metadata.uid,
                path=kubeconfig,
            )
        except Exception as exc:  # the pod may be gone already; the next event decides
            log.warning("no token for pod %s/%s: %s", ns, name, exc)
            return
        listen = self._sidecar_listen(pod_dir, pod.metadata.uid)
        running = RunningPod(
            namespace=ns,
            name=name,
            uid=pod.metadata.uid,
            listen=listen,
            grace=float(spec.termination_grace_period_seconds or 30),
        )
        for c in runnable:
            env = self._container_env(pod, c, kubeconfig=kubeconfig, listen=listen)
            argv = [self._resolve(c.command[0]), *c.command[1:], *(c.args or [])]
            running.containers.append(
                Container(name=c.name, argv=argv, env=env, log_path=pod_dir / f"{c.name}.log",
                          sidecar=any(c is s for s in sidecars))
            )
        self.pods[running.key] = running
        for container in running.containers:
            self._spawn(running, container)
        log.info("started pod %s (sidecar at %s): %s", running.key, listen,
                 ", ".join(c.name for c in running.containers))
        self._write_state()

    def _sidecar_listen(self, pod_dir: Path, uid: str) -> str:
        """The pod's sidecar socket: in its state dir, or in the runner's short dir."""
        path = pod_dir / f"sidecar-{uid[:8]}.sock"
        if len(str(path).encode()) > SOCKET_PATH_MAX:
            if self.socket_dir is None:
                self.socket_dir = Path(tempfile.mkdtemp(prefix="kgroup-runner-"))
            path = self.socket_dir / f"{uid}.sock"
        return f"unix://{path}"

    def _resolve(self, executable: str) -> str:
        if "/" in executable:
            return executable
        found = shutil.which(executable, path=f"{self.venv_bin}{os.pathsep}{os.environ['PATH']}")
        return found or executable

    def _container_env(self, pod: Any, c: Any, *, kubeconfig: Path,
                       listen: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.venv_bin}{os.pathsep}{env.get('PATH', '')}"
        for var in c.env or []:
            if var.value is not None:
                env[var.name] = var.value
            elif var.value_from is not None and var.value_from.field_ref is not None:
                value = _field_ref(pod, var.value_from.field_ref.field_path)
                if value is not None:
                    env[var.name] = value
        env.update(self.extra_env)
        if has_token(pod, c):
            env["KUBECONFIG"] = str(kubeconfig)
        else:  # as the kubelet does: no token in a container that mounts none
            env.pop("KUBECONFIG", None)
        env["KGROUP_LISTEN"] = listen
        env["KGROUP_SIDECAR_URL"] = sidecar_url(listen)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        if self.audit_dir is not None:
            ns, name = pod.metadata.namespace, pod.metadata.name
            env["KGROUP_AUDIT_FILE"] = str(self.audit_dir / f"{ns}_{name}.jsonl")
        env["KGROUP_POD_NAME"] = env.get("KGROUP_POD_NAME", pod.metadata.name)
        env["KGROUP_NAMESPACE"] = env.get("KGROUP_NAMESPACE", pod.metadata.namespace)
        return env

    def _spawn(self, pod: RunningPod, c: Container) -> None:
        with open(c.log_path, "ab") as out:
            c.proc = subprocess.Popen(
                c.argv, env=c.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def _terminate(self, pod: RunningPod) -> None:
        """SIGTERM the app containers now; native sidecars once the apps have exited."""
        if pod.terminating_since is None:
            pod.terminating_since = time.monotonic()
            apps = [c for c in pod.containers if not c.sidecar]
            self._signal(apps if any(_alive(c) for c in apps) else pod.containers)
            log.info("pod %s: SIGTERM sent (grace %.0fs)", pod.key, pod.grace)

    @staticmethod
    def _signal(containers: list[Container], sig: signal.Signals = signal.SIGTERM) -> None:
        for c in containers:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(sig)

    # -- housekeeping ----------------------------------------------------------------
    def tick(self) -> None:
        """Restart crashed containers, SIGKILL past the grace period, forget finished pods."""
        now = time.monotonic()
        changed = False
        with self.lock:
            for key, pod in list(self.pods.items()):
                if pod.terminating_since is not None:
                    alive = [c for c in pod.containers if _alive(c)]
                    if alive and all(c.sidecar for c in alive) and not pod.sidecars_signalled:
                        pod.sidecars_signalled = True
                        self._signal(alive)
                    if alive and now - pod.terminating_since > pod.grace:
                        for c in alive:
                            assert c.proc is not None
                            c.proc.kill()
                        log.info("pod %s: SIGKILL after grace", key)
                    if not alive:
                        del self.pods[key]
                        changed = True
                    continue
                for c in pod.containers:
                    if c.proc is not None and c.proc.poll() is not None:
                        c.restarts += 1
                        delay = min(RESTART_BACKOFF_MAX, 0.5 * 2 ** min(c.restarts, 5))
                        c.next_start = now + delay
                        log.info("pod %s: container %s exited (%s), restart in %.1fs",
                                 key, c.name, c.proc.returncode, delay)
                        c.proc = None
                    if c.proc is None and now >= c.next_start:
                        self._spawn(pod, c)
                        changed = True
        if changed:
            self._write_state()

    def _write_state(self) -> None:
        state = {
            pod.key: {
                "uid": pod.uid,
                "sidecar": sidecar_url(pod.listen),
                "containers": {
                    c.name: {
                        "pid": c.proc.pid if c.proc else None,
                        "restarts": c.restarts,
                        "log": str(c.log_path),
                    }
                    for c in pod.containers
                },
            }
            for pod in self.pods.values()
        }
        tmp = self.state_dir / "runner.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / "runner.json")

    # -- loops ---------------------------------------------------------------------
    def watch_namespace(self, namespace: str) -> None:
        while not self.stopping.is_set():
            try:
                listing: Any = self.core.list_namespaced_pod(namespace)
                seen = set()
                for pod in listing.items:
                    seen.add(f"{namespace}/{pod.metadata.name}")
                    self.on_pod("ADDED", pod)
                with self.lock:
                    vanished = [p for k, p in self.pods.items()
                                if p.namespace == namespace and k not in seen]
                    for gone in vanished:
                        self._terminate(gone)
                w: Any = watch.Watch()  # type: ignore[no-untyped-call]
                for event in w.stream(
                    self.core.list_namespaced_pod, namespace,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=60, allow_watch_bookmarks=False,
                ):
                    if self.stopping.is_set():
                        w.stop()
                        break
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.on_pod(event["type"], event["object"])
            except ApiException as exc:
                if exc.status != 410:
                    log.warning("watch pods in %s: %s", namespace, exc.reason)
                    self.stopping.wait(1.0)
            except Exception as exc:  # API server away: keep the processes, retry
                log.warning("watch pods in %s: %s", namespace, exc)
                self.stopping.wait(1.0)

    def run(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._write_state()
        for ns in self.namespaces:
            threading.Thread(target=self.watch_namespace, args=(ns,), daemon=True).start()
        while not self.stopping.is_set():
            self.tick()
            self.stopping.wait(0.2)
        self.shutdown()

    def shutdown(self) -> None:
        with self.lock:
            for pod in self.pods.values():
                self._terminate(pod)
        deadline = time.monotonic() + max([p.grace for p in self.pods.values()] or [0]) + 1
        while self.pods and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.1)
        with self.lock:
            for pod in self.pods.values():
                for c in pod.containers:
                    if c.proc is not None and c.proc.poll() is None:
                        c.proc.kill()
            self.pods.clear()
        self._write_state()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def _alive(c: Container) -> bool:
    return c.proc is not None and c.proc.poll() is None


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def has_token(pod: Any, c: Any) -> bool:
    """Whether the kubelet would give container ``c`` the pod's service-account token: it
    mounts a volume at the service-account path (a projected token, as the chart gives the
    sidecar alone), or the pod does not turn automounting off."""
    if any(m.mount_path.rstrip("/") == SERVICE_ACCOUNT_DIR for m in c.volume_mounts or []):
        return True
    return pod.spec.automount_service_account_token is not False


def _field_ref(pod: Any, path: str) -> str | None:
    values = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path in values:
        value = values[path]
        return None if value is None else str(value)
    if path.startswith("metadata.labels['") and path.endswith("']"):
        return (pod.metadata.labels or {}).get(path[len("metadata.labels['"):-2])
    if path.startswith("metadata.annotations['") and path.endswith("']"):
        return (pod.metadata.annotations or {}).get(path[len("metadata.annotations['"):-2])
    return None


class TokenWriter(Protocol):
    """Writes a kubeconfig with a token bound to the pod (see tokens.pod_kubeconfig)."""

    def __call__(self, *, namespace: str, service_account: str, pod_name: str,
                 pod_uid: str, path: Path) -> Path: ...


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kgroup_devcluster.runner",
        description="Run the containers of Running pods as local processes (see module doc).",
    )
    parser.add_argument("--namespace", action="append", required=True,
                        help="namespace whose pods to run (repeatable)")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--audit-dir", type=Path, default=None,
                        help="give every pod's sidecar an ownership audit file here")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for every container (e.g. a Redis URL)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s runner %(message)s")
    from kgroup_devcluster.cluster import running
    from kgroup_devcluster.tokens import pod_kubeconfig

    cluster = running()
    if cluster is None:
        parser.error("no local cluster is running (make cluster-up)")

    def write_token(*, namespace: str, service_account: str, pod_name: str,
                    pod_uid: str, path: Path) -> Path:
        return pod_kubeconfig(cluster, namespace=namespace, service_account=service_account,
                              pod_name=pod_name, pod_uid=pod_uid, path=path)

    extra = dict(item.split("=", 1) for item in args.env)
    runner = LocalRunner(
        kubeconfig=str(cluster.kubeconfig), namespaces=args.namespace, state_dir=args.state_dir,
        extra_env=extra, venv_bin=Path(sys.executable).parent, token_writer=write_token,
        audit_dir=args.audit_dir,
    )
    if args.audit_dir is not None:
        args.audit_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: runner.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: runner.stopping.set())
    runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
