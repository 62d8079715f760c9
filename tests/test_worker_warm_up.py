"""The PySpark worker's warm-up wait: a pod told to stop during its warm-up stops, rather
than waiting for the warm-up job to finish (it holds nothing yet)."""

from __future__ import annotations

import threading
import time

from kgroup_pipeline.worker import wait_unless_stopped


def blocked_thread(release: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    return thread


def test_a_stop_during_the_warm_up_ends_the_wait_before_the_warm_up_does() -> None:
    release, stop = threading.Event(), threading.Event()
    thread = blocked_thread(release)
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    try:
        assert wait_unless_stopped(thread, stop, timeout=60.0) is False
        # a plain join(timeout=60) would have returned after 60 s
        assert time.monotonic() - started < 30.0
        assert thread.is_alive()
    finally:
        release.set()


def test_a_finished_warm_up_is_reported_and_a_slow_one_times_out() -> None:
    release, stop = threading.Event(), threading.Event()
    release.set()
    assert wait_unless_stopped(blocked_thread(release), stop, timeout=30.0) is True
    slow = threading.Event()
    try:
        assert wait_unless_stopped(blocked_thread(slow), stop, timeout=0.3) is False
    finally:
        slow.set()
