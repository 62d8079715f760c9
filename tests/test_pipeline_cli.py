"""The pipeline's command lines as processes: producer, verifier, workers stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup_pipeline.scripted import ScriptedCoordinator, serve_sidecar
from kgroup_pipeline.verify import verify

__all__ = ["rclient", "redis_url", "stream"]


def wait_for(cond: Callable[[], bool], timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def producer_and_verifier(redis_url: str, stream: str) -> None:
    subprocess.run(py("kgroup_pipeline.producer", "--redis", redis_url, "--stream", stream,
                      "--partitions", "8", "--rate", "0", "--count", "3000", "--keys", "50",
                      "--bad-every", "100"), check=True, timeout=120)


def run_worker_until_sigterm(module: str, rclient: redis.Redis, redis_url: str,
                             stream: str, timeout: float) -> None:
    coord = ScriptedCoordinator(8)
    coord.assign("w", list(range(8)))
    server, url = serve_sidecar(coord, "w")
    env = dict(os.environ, KGROUP_REDIS_URL=redis_url, KGROUP_SIDECAR_URL=url)
    proc = subprocess.Popen(py(module, "--stream", stream), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: proc.poll() is not None or verify(rclient, stream).caught_up,
                 timeout=timeout, what="catch-up")
        assert proc.poll() is None, "worker exited early"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.shutdown()
        server.server_close()
    # Every partition was handed back, each at the offset its last batch committed.
    released = {p: pos for _, p, _, pos in coord.releases}
    assert sorted(released) == list(range(8))
    for p, pos in released.items():
        assert pos == rclient.hget(f"kgroup:{{{stream}}}:sink:p:{p}", "offset")
        assert coord.holder(p) == (None, 1)


def test_light_worker_process_consumes_and_hands_everything_back_on_sigterm(
        rclient: redis.Redis, redis_url: str, stream: str) -> None:
    producer_and_verifier(redis_url, stream)
    run_worker_until_sigterm("kgroup_pipeline.light_worker", rclient, redis_url, stream, 120)
    ok = subprocess.run(py("kgroup_pipeline.verify", "--redis", redis_url, "--stream", stream),
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "zombie_refused=0" in ok.stdout


def test_verifier_process_says_incomplete_before_any_worker_ran(
        redis_url: str, stream: str) -> None:
    producer_and_verifier(redis_url, stream)
    out = subprocess.run(py("kgroup_pipeline.verify", "--redis", redis_url, "--stream", stream),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "INCOMPLETE" in out.stderr


@pytest.mark.spark
def test_pyspark_worker_process_consumes_and_hands_everything_back_on_sigterm(
        rclient: redis.Redis, redis_url: str, stream: str) -> None:
    producer_and_verifier(redis_url, stream)
    run_worker_until_sigterm("kgroup_pipeline.worker", rclient, redis_url, stream, 300)
    assert verify(rclient, stream).clean
