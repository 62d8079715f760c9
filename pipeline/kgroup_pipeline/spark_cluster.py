"""A Spark standalone cluster on loopback, for when one pod's cores are not enough.

    python -m kgroup_pipeline.spark_cluster up [--workers 1] [--cores 2] [--memory 1536m]
    python -m kgroup_pipeline.spark_cluster status
    python -m kgroup_pipeline.spark_cluster down

Rule: we stop exactly what we started. ``up`` launches a master and its workers with the
pyspark wheel's own ``bin/spark-class`` (nothing else is downloaded), each in a session of
its own, and records PID and argv in ``<state>/cluster.json``. ``spark-class`` ``exec``\\ s
the JVM, so the argv recorded is the JVM's, read back from ``/proc/<pid>/cmdline`` once the
exec happened. ``down`` signals a PID only while its cmdline is still exactly that argv
(a PID alone may belong to someone else by then), and also ends the executors the workers
launched (their descendants, recorded the same way just before the workers are stopped)
should any outlive its worker.

Loopback only: every process gets ``SPARK_LOCAL_IP=127.0.0.1`` and ``--host 127.0.0.1``
(without it Spark binds to the eth0 address); the master's and workers' web UIs then bind
to 127.0.0.1 too; the master's REST submission server is switched off (unused, and it
would take the fixed port 6066). ``status`` lists every listening socket of the cluster's
processes and their descendants (``ss -ltnp``).

Drivers connect with :func:`cluster_conf` (executor cores and memory, ``spark.cores.max``
per driver so that several member drivers share the cluster) and ship this package and
``kgroup`` to the executors with :func:`pyfiles_zip` (``SparkContext.addPyFile``), so the
executors never depend on finding the driver's source tree.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
REPO = Path(__file__).resolve().parents[2]
LOOPBACK_ADDRESSES = ("127.0.0.1", "[::ffff:127.0.0.1]", "::ffff:127.0.0.1", "[::1]", "::1")


def default_state_dir() -> Path:
    return Path(os.environ.get("KGROUP_SPARK_STATE", str(REPO / ".state" / "spark")))


def spark_home() -> Path:
    """The pyspark wheel's own Spark distribution (bin/spark-class, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port(preferred: int | None = None) -> int:
    """`preferred` if it is free on 127.0.0.1, else any free port."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError("no free port on 127.0.0.1")


# ---- processes: recorded by PID and argv, signalled only while they still match ---------


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int
    argv: tuple[str, ...]


def read_cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if not raw:  # a zombie or a kernel thread
        return None
    return tuple(p.decode(errors="replace") for p in raw.rstrip(b"\0").split(b"\0"))


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name may hold spaces
    return fields[0], int(fields[1])


def is_ours(proc: Proc) -> bool:
    """True while the PID runs and its cmdline is still the recorded argv."""
    if read_cmdline(proc.pid) != proc.argv:
        return False
    st = _stat(proc.pid)
    return st is not None and st[0] not in ("Z", "X")


def descendants(pids: Iterable[int]) -> list[Proc]:
    """Every live descendant of `pids`, with its argv as of now."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                parent[int(entry.name)] = st[1]
    roots, found = set(pids), []
    for pid in sorted(parent):
        p, seen = parent.get(pid), 0
        while p is not None and p not in roots and p > 1 and seen < 64:
            p, seen = parent.get(p), seen + 1
        if p in roots and pid not in roots:
            argv = read_cmdline(pid)
            if argv:
                found.append(Proc(f"child-of-{p}", pid, argv))
    return found


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _exiting(proc: Proc) -> bool:
    """Still ours, or on its way out (an exiting process's cmdline reads empty)."""
    st = _stat(proc.pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    cmd = read_cmdline(proc.pid)
    return cmd is None or cmd == proc.argv


def stop_proc(proc: Proc, *, grace: float = 15.0) -> bool:
    """SIGTERM if still ours, SIGKILL after `grace`; returns once it is gone (or a zombie
    of someone else). True when a signal was sent."""
    if not is_ours(proc):
        _reap(proc.pid)
        return False
    os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not _exiting(proc):
            return True
        time.sleep(0.1)
    if is_ours(proc):
        os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _exiting(proc) and time.monotonic() < deadline:
        _reap(proc.pid)
        time.sleep(0.05)
    _reap(proc.pid)
    return True


def launch(name: str, argv: Sequence[str], *, main_class: str, env: Mapping[str, str],
           log: Path, timeout: float = 30.0) -> Proc:
    """Start `argv` (spark-class ...) detached and wait for its exec into the JVM."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        out.flush()
        child = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env=dict(env))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"{name} exited with {child.returncode}:\n{tail(log)}")
        cmd = read_cmdline(child.pid)
        if cmd and main_class in cmd and Path(cmd[0]).name == "java":
            return Proc(name, child.pid, cmd)
        time.sleep(0.05)
    child.kill()
    child.wait(5)
    raise TimeoutError(f"{name} did not exec into the JVM within {timeout:.0f} s")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


# ---- the cluster ------------------------------------------------------------------------


@dataclass
class ClusterState:
    master_url: str
    ui_url: str
    workers: int
    cores: int
    memory: str
    procs: list[Proc] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        data["procs"] = [{"name": p.name, "pid": p.pid, "argv": list(p.argv)} for p in self.procs]
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        procs = [Proc(p["name"], int(p["pid"]), tuple(p["argv"])) for p in data.pop("procs")]
        return cls(**data, procs=procs)


def master_json(ui_url: str, *, timeout: float = 2.0) -> dict[str, Any]:
    """The master's own summary (``/json/``): status, aliveworkers, cores, apps."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{ui_url}/json/", timeout=timeout) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


def listening_sockets(pids: Iterable[int]) -> list[tuple[int, str]]:
    """(pid, local address:port) of every listening TCP socket of `pids` (``ss -ltnp``)."""
    wanted = set(pids)
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found: list[tuple[int, str]] = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        for pid in (int(m) for m in re.findall(r"pid=(\d+)", line)):
            if pid in wanted:
                found.append((pid, cols[3]))
    return found


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return host in LOOPBACK_ADDRESSES


class SparkCluster:
    """One master and `workers` workers, recorded in ``<state_dir>/cluster.json``."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir or default_state_dir()
        self.state_file = self.state_dir / "cluster.json"

    def load(self) -> ClusterState | None:
        try:
            return ClusterState.from_json(self.state_file.read_text())
        except FileNotFoundError:
            return None

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_DAEMON_MEMORY="256m", SPARK_LOG_DIR=str(self.state_dir / "logs"),
                   PYSPARK_PYTHON=sys.executable, NO_PROXY="127.0.0.1,localhost")
        env.update(extra)
        return env

    def running(self) -> ClusterState | None:
        """The recorded cluster if every one of its processes is still ours."""
        state = self.load()
        if state is not None and state.procs and all(is_ours(p) for p in state.procs):
            return state
        return None

    def up(self, *, workers: int = 1, cores: int = 2, memory: str = "1536m",
           port: int = 7077, timeout: float = 120.0) -> ClusterState:
        """Start the cluster (or return the one already running) and wait until every
        worker has registered with the master."""
        current = self.running()
        if current is not None:
            return current
        self.down()  # a half-dead earlier cluster: stop whatever of it is still ours
        self.state_dir.mkdir(parents=True, exist_ok=True)
        spark_class = str(spark_home() / "bin" / "spark-class")
        master_port, ui_port = free_port(port), free_port()
        state = ClusterState(master_url=f"spark://127.0.0.1:{master_port}",
                             ui_url=f"http://127.0.0.1:{ui_port}", workers=workers,
                             cores=cores, memory=memory)
        try:
            state.procs.append(launch(
                "master",
                [spark_class, MASTER_CLASS, "--host", "127.0.0.1", "--port", str(master_port),
                 "--webui-port", str(ui_port)],
                main_class=MASTER_CLASS, log=self.state_dir / "master.log",
                env=self.env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")))
            self._save(state)
            self._wait(state, lambda doc: doc.get("status") == "ALIVE", "the master", timeout)
            for i in range(1, workers + 1):
                work = self.state_dir / "work" / f"worker-{i}"
                work.mkdir(parents=True, exist_ok=True)
                state.procs.append(launch(
                    f"worker-{i}",
                    [spark_class, WORKER_CLASS, "--host", "127.0.0.1", "--cores", str(cores),
                     "--memory", memory, "--webui-port", "0", "--work-dir", str(work),
                     state.master_url],
                    main_class=WORKER_CLASS, log=self.state_dir / f"worker-{i}.log",
                    env=self.env(SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=true")))
                self._save(state)
            self._wait(state, lambda doc: int(doc.get("aliveworkers", 0)) >= workers,
                       f"{workers} worker(s) to register", timeout)
        except BaseException:
            self.down()
            raise
        return state

    def _save(self, state: ClusterState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(state.to_json())
        tmp.replace(self.state_file)
        (self.state_dir / "master-url").write_text(state.master_url + "\n")

    def _wait(self, state: ClusterState, ready: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            dead = [p.name for p in state.procs if not is_ours(p)]
            if dead:
                logs = "\n".join(tail(self.state_dir / f"{n}.log") for n in dead)
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{logs}")
            try:
                doc = master_json(state.ui_url)
                if ready(doc):
                    return
                last = {k: doc.get(k) for k in ("status", "aliveworkers", "cores")}
            except (OSError, ValueError) as e:
                # ValueError: a master just started once answered /json/ with its HTML
                # page (CI, stop 42); it is not up yet, ask again
                last = e
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last})")

    def down(self, *, grace: float = 15.0) -> list[str]:
        """Stop the recorded processes that are still ours (workers first), and any
        executor that outlives its worker. Returns the names of what was signalled."""
        state = self.load()
        if state is None:
            return []
        stopped: list[str] = []
        workers = [p for p in state.procs if p.name != "master"]
        masters = [p for p in state.procs if p.name == "master"]
        children = descendants(p.pid for p in workers if is_ours(p))
        for proc in [*workers, *masters]:
            if stop_proc(proc, grace=grace):
                stopped.append(proc.name)
        for proc in children:  # executors end with their worker; this is the backstop
            if stop_proc(proc, grace=5.0):
                stopped.append(f"{proc.name} (pid {proc.pid})")
        self.state_file.unlink(missing_ok=True)
        (self.state_dir / "master-url").unlink(missing_ok=True)
        return stopped

    def status(self) -> dict[str, Any]:
        state = self.load()
        if state is None:
            return {"up": False, "processes": []}
        procs = [{"name": p.name, "pid": p.pid, "alive": is_ours(p)} for p in state.procs]
        alive = [p.pid for p in state.procs if is_ours(p)]
        pids = alive + [c.pid for c in descendants(alive)]
        out: dict[str, Any] = {
            "up": all(p["alive"] for p in procs), "master_url": state.master_url,
            "ui_url": state.ui_url, "processes": procs,
            "listening": [f"{addr} (pid {pid})" for pid, addr in listening_sockets(pids)],
        }
        try:
            doc = master_json(state.ui_url)
            out.update({k: doc.get(k) for k in ("status", "aliveworkers", "cores", "coresused",
                                                "memory", "memoryused")})
            out["apps"] = [f"{a.get('name')} cores={a.get('cores')} state={a.get('state')}"
                           for a in doc.get("activeapps", [])]
        except OSError as e:
            out["master_error"] = str(e)
        return out


# ---- what a driver needs to use the cluster ----------------------------------------------


def cluster_conf(*, executor_cores: int = 1, executor_memory: str = "512m",
                 cores_max: int = 1) -> dict[str, str]:
    """Executor sizing for a driver on a standalone cluster.

    Each member pod runs one driver; ``spark.cores.max`` caps what one driver takes, so
    with a worker offering 2 cores two member drivers (1 core each) run side by side
    instead of the first one taking every core and the second waiting for it.
    """
    return {
        "spark.executor.cores": str(executor_cores),
        "spark.executor.memory": executor_memory,
        "spark.cores.max": str(cores_max),
        # Loopback: executors reach the driver (and its block manager) on 127.0.0.1.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


def pyfiles_zip(directory: Path | None = None) -> Path:
    """A zip of the packages the executors import (kgroup_pipeline and kgroup), built
    from the driver's own copies, for ``SparkContext.addPyFile``."""
    import kgroup
    import kgroup_pipeline

    if directory is None:  # a driver's own temporary copy, gone when the driver exits
        directory = Path(tempfile.mkdtemp(prefix="kgroup-pyfiles-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    target = directory / "kgroup-job.zip"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for pkg in (kgroup_pipeline, kgroup):
            assert pkg.__file__ is not None
            root = Path(pkg.__file__).resolve().parent
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                    zf.write(path, str(Path(root.name) / path.relative_to(root)))
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kgroup_pipeline.spark_cluster")
    ap.add_argument("--state", type=Path, default=None,
                    help="state dir (default <repo>/.state/spark or $KGROUP_SPARK_STATE)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a master and workers on 127.0.0.1")
    up.add_argument("--workers", type=int, default=1)
    up.add_argument("--cores", type=int, default=2, help="cores each worker offers")
    up.add_argument("--memory", default="1536m", help="memory each worker offers")
    up.add_argument("--port", type=int, default=7077, help="master port (if taken: any)")
    sub.add_parser("down", help="stop what `up` started")
    sub.add_parser("status", help="processes, workers, cores, apps, listening sockets")
    args = ap.parse_args(argv)
    cluster = SparkCluster(args.state)
    if args.cmd == "up":
        t0 = time.monotonic()
        state = cluster.up(workers=args.workers, cores=args.cores, memory=args.memory,
                           port=args.port)
        print(f"spark master {state.master_url} (ui {state.ui_url}), {state.workers} worker(s) "
              f"x {state.cores} cores, ready in {time.monotonic() - t0:.1f}s; "
              f"export KGROUP_SPARK_MASTER={state.master_url}")
        return 0
    if args.cmd == "down":
        stopped = cluster.down()
        print("stopped: " + (", ".join(stopped) if stopped else "nothing (not running)"))
        return 0
    info = cluster.status()
    print(json.dumps(info, indent=2))
    return 0 if info["up"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
