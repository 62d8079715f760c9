"""The standalone cluster helper without a JVM: PID discipline, state, the job's zip, sizing.

A process is signalled only while its cmdline is the recorded argv; the zip shipped to
executors holds both packages and imports on a Python that has neither (the "bare"
interpreter of :mod:`spark_bare_python` strips the editable install when it runs as an
executor's Python, i.e. with ``SPARK_EXECUTOR_DIRS`` set).
"""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_bare_python import bare_python

from kgroup_pipeline.spark_cluster import (
    ClusterState,
    Proc,
    SparkCluster,
    cluster_conf,
    descendants,
    is_loopback,
    is_ours,
    pyfiles_zip,
    read_cmdline,
    stop_proc,
)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    for _ in range(200):  # Popen may return before the exec shows in /proc
        if read_cmdline(proc.pid) == ("sleep", "300"):
            break
        time.sleep(0.01)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def test_a_process_whose_cmdline_is_not_the_recorded_argv_is_never_signalled(
        sleeper: subprocess.Popen[bytes]) -> None:
    other = Proc("master", sleeper.pid, ("java", "org.apache.spark.deploy.master.Master"))
    assert not is_ours(other)
    assert stop_proc(other, grace=1.0) is False
    assert sleeper.poll() is None


def test_a_process_whose_cmdline_matches_is_stopped(
        sleeper: subprocess.Popen[bytes]) -> None:
    argv = read_cmdline(sleeper.pid)
    assert argv == ("sleep", "300")
    proc = Proc("worker-1", sleeper.pid, argv)
    assert is_ours(proc)
    assert stop_proc(proc, grace=5.0) is True
    assert not is_ours(proc)
    sleeper.wait(10)  # already reaped by stop_proc, or reaped now
    assert read_cmdline(sleeper.pid) is None


def test_down_leaves_a_foreign_process_under_a_recorded_pid_alone_and_forgets_the_state(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    cluster = SparkCluster(tmp_path)
    state = ClusterState(master_url="spark://127.0.0.1:1", ui_url="http://127.0.0.1:2",
                         workers=1, cores=2, memory="1g",
                         procs=[Proc("master", sleeper.pid, ("java", "Master")),
                                Proc("worker-1", 2**22 + 7, ("java", "Worker"))])
    cluster.state_file.write_text(state.to_json())
    assert cluster.load() == state
    assert cluster.running() is None
    assert cluster.status()["up"] is False
    assert cluster.down() == []
    assert sleeper.poll() is None
    assert cluster.load() is None
    assert cluster.down() == []  # nothing recorded: nothing to do


def test_descendants_finds_children_with_their_argv(tmp_path: Path) -> None:
    parent = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    try:
        found: list[Proc] = []
        for _ in range(100):
            found = [p for p in descendants([parent.pid]) if p.argv == ("sleep", "300")]
            if found:
                break
            time.sleep(0.05)
        assert len(found) == 1
    finally:
        for p in descendants([parent.pid]):
            stop_proc(p, grace=2.0)
        parent.kill()
        parent.wait(10)


def test_executor_sizing_caps_each_driver_and_stays_on_loopback() -> None:
    conf = cluster_conf(executor_cores=1, executor_memory="512m", cores_max=1)
    assert conf["spark.cores.max"] == "1"
    assert conf["spark.executor.cores"] == "1"
    assert conf["spark.executor.memory"] == "512m"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1:7077", True), ("[::ffff:127.0.0.1]:7077", True), ("[::1]:80", True),
    ("0.0.0.0:8080", False), ("*:8080", False), ("[::]:6066", False),
    ("192.0.2.2:7077", False)])
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_the_job_zip_holds_both_packages_and_imports_where_neither_is_installed(
        tmp_path: Path) -> None:
    zipped = pyfiles_zip(tmp_path)
    names = set(zipfile.ZipFile(zipped).namelist())
    assert {"kgroup_pipeline/source.py", "kgroup_pipeline/range_reader.py",
            "kgroup_pipeline/fencing.py", "kgroup/client.py",
            "kgroup/core/ranges.py"} <= names
    assert not any("__pycache__" in n for n in names)
    python = bare_python(tmp_path)
    env = {**os.environ, "SPARK_EXECUTOR_DIRS": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    probe = "import kgroup_pipeline.source as s, kgroup.client as c; print(s.__file__, c.__file__)"
    without = subprocess.run([str(python), "-c", probe], env=env, capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
    assert without.returncode != 0
    assert "No module named 'kgroup_pipeline'" in without.stderr
    with_zip = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                              env={**env, "PYTHONPATH": str(zipped)}, timeout=60, cwd=tmp_path)
    assert with_zip.returncode == 0, with_zip.stderr
    assert with_zip.stdout.split() == [f"{zipped}/kgroup_pipeline/source.py",
                                       f"{zipped}/kgroup/client.py"]


def test_the_bare_python_keeps_the_package_for_driver_side_processes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_EXECUTOR_DIRS"}
    out = subprocess.run([str(bare_python(tmp_path)), "-c", "import kgroup_pipeline"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_waiting_for_the_master_rides_over_an_html_answer_to_its_json_url(
        tmp_path: Path) -> None:
    # A master just started once answered /json/ with its HTML page (CI, stop 42); the
    # wait must take that as "not up yet", not fail the cluster's start.
    answers = [b"<!DOCTYPE html><html></html>", b"<!DOCTYPE html><html></html>",
               b'{"status": "ALIVE", "aliveworkers": 0}']
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = answers[min(len(asked), len(answers)) - 1]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        state = ClusterState(master_url="spark://127.0.0.1:1",
                             ui_url=f"http://127.0.0.1:{server.server_address[1]}",
                             workers=0, cores=1, memory="1g")
        SparkCluster(tmp_path)._wait(state, lambda doc: doc.get("status") == "ALIVE",
                                     "the master", timeout=10.0)
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["/json/"] * 3
