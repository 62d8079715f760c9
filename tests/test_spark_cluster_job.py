"""The worker job on a real local standalone cluster whose executors lack the package.

One cluster (master + one worker, 2 cores) in a temporary state dir: every listening
socket is on loopback, ``up`` again starts nothing new, the worker process (static
ownership, driver on the cluster) runs with executors whose Python cannot import
kgroup_pipeline except from the shipped zip, the verifier is clean, and ``down`` leaves
no process of the cluster — executors included — behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from pipeline_fixtures import rclient, redis_url, stream
from spark_bare_python import bare_python

from kgroup_pipeline.producer import produce
from kgroup_pipeline.spark_cluster import (
    SparkCluster,
    descendants,
    is_loopback,
    is_ours,
    listening_sockets,
    master_json,
)
from kgroup_pipeline.verify import render, verify

__all__ = ["rclient", "redis_url", "stream"]
pytestmark = [pytest.mark.spark, pytest.mark.slow]


def wait_for(cond: object, timeout: float, what: str) -> None:
    assert callable(cond)
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def test_the_worker_runs_on_the_cluster_with_executors_that_only_have_the_shipped_zip(
        tmp_path: Path, rclient: redis.Redis, redis_url: str, stream: str) -> None:
    cluster = SparkCluster(tmp_path / "spark")
    state = cluster.up(workers=1, cores=2, memory="1g", port=0)
    worker: subprocess.Popen[bytes] | None = None
    executors: list[int] = []
    try:
        assert [p.name for p in state.procs] == ["master", "worker-1"]
        assert all(is_ours(p) for p in state.procs)
        assert cluster.up() == state  # already running: nothing new started
        sockets = listening_sockets(p.pid for p in state.procs)
        assert len(sockets) >= 3, sockets  # master RPC + UI, worker RPC (+ UI)
        assert [s for s in sockets if not is_loopback(s[1])] == []
        assert not any(s[1].endswith(":6066") for s in sockets)  # no REST server
        assert cluster.status()["aliveworkers"] == 1

        produce(rclient, stream=stream, partitions=8, count=4000, keys=100, bad_every=200,
                seed=31)
        python = bare_python(tmp_path / "bare")
        env = {**os.environ, "KGROUP_PYSPARK_PYTHON": str(python),
               "KGROUP_SPARK_MASTER": state.master_url}
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "kgroup_pipeline.worker", "--redis", redis_url,
                 "--stream", stream, "--static", "0-7", "--cores-max", "1"],
                env=env, stdout=out, stderr=subprocess.STDOUT)

        def caught_up() -> bool:
            assert worker is not None and worker.poll() is None, log.read_text()[-4000:]
            return verify(rclient, stream).caught_up

        wait_for(caught_up, 300, "catch-up")
        apps = master_json(state.ui_url)["activeapps"]
        assert [int(a["cores"]) for a in apps] == [1]  # spark.cores.max=1
        executors = [d.pid for d in descendants(p.pid for p in state.procs)
                     if "CoarseGrainedExecutorBackend" in " ".join(d.argv)]
        assert len(executors) == 1
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(120) == 0, log.read_text()[-4000:]
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(30)
        stopped = cluster.down()
    assert {"master", "worker-1"} <= set(stopped)
    assert all(not is_ours(p) for p in state.procs)
    assert not [pid for pid in executors if Path(f"/proc/{pid}").exists()]
    report = verify(rclient, stream)
    assert report.clean and report.caught_up, render(report)
    assert report.total("committed") + report.total("dead") == 4000
    assert report.total("dead") == report.total("bad") == 20
    calls = (tmp_path / "bare" / "calls.log").read_text().splitlines()
    # The events were read and aggregated by the executor's (bare) Python, so the
    # package came from the zip; the planner ran driver-side.
    assert any("executor=True -m pyspark.daemon pyspark.worker" in c for c in calls), calls
    assert any("executor=False" in c and "streaming_source_runner" in c for c in calls), calls
    log_text = log.read_text()
    assert f"session on {state.master_url}" in log_text
