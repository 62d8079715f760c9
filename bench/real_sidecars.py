"""N real ``kgroup-sidecar`` processes on the local control plane, each with a tiny app,
for the cost benchmarks (``bench/bench_cost.py --real N``): what N pods' sidecars cost,
each with its own watches and connections."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stage import Stage

from kgroup.core.objects import Obj

APP_RELEASES_IN_FLIGHT = 32
"""The benchmark apps' releases in flight at once (all apps together)."""


class RealSidecars:
    """N ``kgroup-sidecar`` processes and a tiny app for each (one thread drives them all):
    every second it reads each assignment, releases what is revoking, reports health.
    Releases are sent concurrently (:data:`APP_RELEASES_IN_FLIGHT`), as N pods' apps
    would each release theirs: one ``POST .../release`` answers once the lock is written,
    and sent one after another for every app a join's ≈ 900 releases at 10,000 partitions
    took most of its 56 s (the old owners' apps, not kgroup, set the pace)."""

    def __init__(self, st: Stage, pods: list[str], base_port: int,
                 figures: Callable[[str, int], tuple[float, int]] | None = None, *,
                 app: bool = True, app_timeout: float | None = 0.0) -> None:
        """``figures(pod, partition)``: the (rate, lag) its app reports for a partition it
        holds (default: no rate, a made-up lag). ``app`` False: no tiny app; the caller's
        workers are the sidecars' apps. ``app_timeout``: the sidecars'
        ``KGROUP_APP_TIMEOUT_SECONDS``; 0 (the default) turns the app's part off (the
        benchmark's apps are measured, not waited for); None leaves the sidecar's default
        (real apps: a pod joins when its app first asks, as in a cluster)."""
        self.st = st
        self.app_timeout = app_timeout
        self.figures = figures
        self.exe = str(Path(sys.executable).with_name("kgroup-sidecar"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.base_port = base_port
        self._next_port = base_port
        self._stop = threading.Event()
        self._tick = 0
        self.errors = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(APP_RELEASES_IN_FLIGHT,
                                                           thread_name_prefix="app-release")
        self._thread = threading.Thread(target=self._app, name="apps", daemon=True)
        self.add(pods)
        if app:
            self._thread.start()

    def add(self, pods: list[str]) -> None:
        for pod in pods:
            port = self._next_port  # never one of a running sidecar's, after a leave
            self._next_port += 1
            self.ports[pod] = port
            env = {**os.environ, "KUBECONFIG": str(self.st.cluster.kubeconfig),
                   "KGROUP_GROUP": self.st.group, "KGROUP_NAMESPACE": self.st.ns,
                   "KGROUP_POD_NAME": pod, "KGROUP_LISTEN": f"127.0.0.1:{port}",
                   "KGROUP_LOG_LEVEL": "WARNING", "NO_PROXY": "127.0.0.1,localhost"}
            if self.app_timeout is not None:
                env["KGROUP_APP_TIMEOUT_SECONDS"] = f"{self.app_timeout:g}"
            with (self.st.workdir / f"sidecar-{pod}.log").open("ab") as out:
                self.procs[pod] = subprocess.Popen([self.exe], env=env, stdout=out,
                                                   stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL)

    def leave(self, pod: str) -> None:
        """SIGTERM, as a pod's deletion: its app keeps running until the sidecar is gone
        and releases what is revoked (it stopped at once until 2026-11-26: every leave then
        waited for the shutdown's drain timeout, ≈ 19 s even at 8 partitions)."""
        proc = self.procs.pop(pod)
        proc.terminate()
        try:
            proc.wait(60)
        finally:
            self.ports.pop(pod, None)

    def crash(self, pod: str) -> float:
        """SIGKILL, as a node lost: no release, no session ended; -> when it was sent
        (monotonic)."""
        proc = self.procs.pop(pod)
        self.ports.pop(pod, None)
        at = time.monotonic()
        proc.kill()
        proc.wait(10)
        return at

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def _call(self, port: int, method: str, path: str, body: Obj | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read() or b"null")

    def _release(self, port: int, p: Obj) -> None:
        with contextlib.suppress(OSError):
            self._call(port, "POST", f"/v1/partitions/{p['partition']}/release",
                       {"token": p["token"], "position": p.get("position")})

    def _app(self) -> None:
        while not self._stop.wait(1.0):
            self._tick += 1
            releases: list[concurrent.futures.Future[None]] = []
            for _pod, port in list(self.ports.items()):
                try:
                    view = self._call(port, "GET", "/v1/assignment")
                    report = []
                    for p in view.get("partitions") or []:
                        if p["state"] == "revoking":
                            releases.append(self._pool.submit(self._release, port, p))
                            continue
                        n = p["partition"]
                        entry = {"partition": n, "token": p["token"],
                                 "position": f"{1000 * self._tick + n}-0",
                                 "lag": (self._tick * 7 + n) % 50}
                        if self.figures is not None:
                            entry["rate"], entry["lag"] = self.figures(_pod, n)
                        report.append(entry)
                    if report:
                        self._call(port, "POST", "/v1/health", {"partitions": report})
                except (OSError, ValueError, KeyError):
                    self.errors += 1  # not up yet, or going away
            concurrent.futures.wait(releases)  # the next look sees them released

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# ---- one size ---------------------------------------------------------------------------
