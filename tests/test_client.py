"""The app client against a real sidecar HTTP server fed by a scripted core (no cluster).

The driver below is the sidecar's loop with the Kubernetes writes replaced by an
in-memory lock table: every acquisition and release succeeds at once. Every test runs
twice: the sidecar on a Unix socket (what the chart renders) and on loopback TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kgroup.client import AsyncSidecarClient, SidecarAddress, SidecarClient, SidecarError
from kgroup.core.locks import LeaseTiming
from kgroup.core.member.reconcile import (
    Acquire,
    EndSession,
    Fence,
    Lock,
    Release,
    Renew,
    StartSession,
    Target,
)
from kgroup_sidecar.http_api import serve
from kgroup_sidecar.probe import main as probe_main
from kgroup_sidecar.runtime import Sidecar
from kgroup_sidecar.settings import Settings
from kgroup_testing.sidecar_harness import free_port

POD = "pod-a"


class Scripted:
    """A real Sidecar object and HTTP server on a private loop; the core is scripted."""

    def __init__(self, socket_path: Path | None) -> None:
        self.port = free_port()
        self.socket_path = socket_path
        self.loop = asyncio.new_event_loop()
        # no app gate: these tests script the sidecar's core around the client; the app's
        # part is tested in tests/test_app_presence.py and on a real API server
        settings = Settings(group="g", namespace="ns", pod_name=POD, listen_port=self.port,
                            listen_socket=str(socket_path) if socket_path else None,
                            app_timeout_seconds=0)
        self.sc = Sidecar(settings)
        self.released: dict[int, str | None] = {}
        self.renewals_fail = False
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = self.call(serve(self.sc, settings))
        self.driver = asyncio.run_coroutine_threadsafe(self.drive(), self.loop)

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def set(self, *, target: list[int], epoch: int, partitions: int = 4) -> None:
        async def apply() -> None:
            sc, logic = self.sc, self.sc.logic
            logic.timing, logic.drain_timeout = LeaseTiming(duration=3, renew_interval=1), 30.0
            logic.synced = {"group", "member", "partition"}
            logic.target = Target(epoch, frozenset(target))
            logic.in_target = True
            for p in range(partitions):
                logic.locks.setdefault(p, Lock(p, None, None, 0, str(10 + p),  # rv 10 + p
                                               assigned=POD))
            sc.dirty.set()

        self.call(apply())

    async def drive(self) -> None:
        sc, m, logic = self.sc, self.sc.member, self.sc.logic
        while True:
            sc.dirty.clear()
            snap = logic.snapshot()
            for a in m.step(snap):
                now = sc.clock()
                if isinstance(a, StartSession) and self.renewals_fail:
                    m.session_start_failed(now=now)
                elif isinstance(a, StartSession):
                    m.session_started("S1", sent_at=now, timing=a.timing, now=now)
                elif isinstance(a, Renew) and not self.renewals_fail:
                    m.renewed(a.session, sent_at=now, timing=a.timing, epoch=a.epoch, now=now)
                elif isinstance(a, Acquire):
                    rv = str(a.token + 100)  # stored above its precondition
                    logic.locks[a.partition] = Lock(a.partition, POD, a.session, a.token, rv)
                    m.acquired(a.partition, a.session, token=a.token, resource_version=rv)
                elif isinstance(a, Release):
                    logic.locks[a.partition] = Lock(a.partition, None, None, a.token,
                                                    str(a.token + 200), a.position)
                    self.released[a.partition] = a.position
                    m.released(a.partition, a.session)
                    logic._resolve(a.partition, a.token, True)
                elif isinstance(a, Fence):
                    logic.execute(a)
                elif isinstance(a, EndSession):
                    m.session_ended()
            sc.publish()
            wake = m.next_wakeup(snap) if snap.timing else None
            timeout = None if wake is None else max(0.02, wake - sc.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sc.dirty.wait(), timeout)

    def close(self) -> None:
        self.driver.cancel()
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    @property
    def url(self) -> str:
        if self.socket_path is not None:
            return f"unix://{self.socket_path}"
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(params=["unix", "tcp"])
def scripted(request: pytest.FixtureRequest) -> Iterator[Scripted]:
    # A short directory of its own: a Unix socket path is limited to ~107 bytes.
    with tempfile.TemporaryDirectory(prefix="kgc-") as tmp:
        s = Scripted(Path(tmp) / "sidecar.sock" if request.param == "unix" else None)
        try:
            yield s
        finally:
            s.close()


def wait(what: str, cond: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = cond()
        if result:
            return result
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def raw(sidecar: Scripted, path: str, method: str = "GET",
        body: bytes | None = None) -> tuple[int, Any]:
    """One request to the sidecar's API, over its transport."""
    conn = SidecarAddress.parse(sidecar.url).connection(5)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    return resp.status, json.loads(text) if text.startswith("{") else text


def test_assignment_reports_partitions_tokens_and_validity(scripted: Scripted) -> None:
    scripted.set(target=[1, 2], epoch=5)
    c = SidecarClient(scripted.url)
    a = wait("acked", lambda: (x := c.assignment()).acked_epoch == 5 and x)
    assert [(p.partition, p.token, p.state) for p in a.partitions] == [(1, 11, "active"),
                                                                        (2, 12, "active")]
    assert a.session == "S1" and not a.fenced
    assert 0 < a.valid_until - time.monotonic() <= 3.0


def test_client_stops_reporting_past_valid_for_even_without_the_sidecar(
        scripted: Scripted) -> None:
    scripted.set(target=[0], epoch=1)
    now = [1000.0]
    c = SidecarClient(scripted.url, clock=lambda: now[0])
    a = wait("owned", lambda: (x := c.assignment()).partitions and x)
    valid_for = a.valid_until - 1000.0
    now[0] = 1000.0 + valid_for - 0.01
    assert [p.partition for p in a.partitions] == [0]
    now[0] = 1000.0 + valid_for
    assert a.partitions == () and a.expired


def test_long_poll_answers_on_change_and_on_timeout(scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    a = wait("acked", lambda: (x := c.assignment()).acked_epoch == 1 and x)
    same = c.wait_for_change(a.version, timeout=0.2)
    assert same.version == a.version
    threading.Timer(0.2, lambda: scripted.set(target=[0], epoch=2)).start()
    changed = c.wait_for_change(a.version, timeout=10)
    assert changed.version > a.version
    assert {p.partition: p.state for p in changed.partitions}[1] == "revoking"


def test_release_hands_over_the_position_and_refuses_bad_requests(scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    wait("acked", lambda: c.assignment().acked_epoch == 1)
    scripted.set(target=[0], epoch=2)
    wait("revoking", lambda: any(p.state == "revoking" for p in c.assignment().partitions))
    status, body = raw(scripted, "/v1/partitions/1/release", "POST", b"not json")
    assert status == 400 and "error" in body
    status, body = raw(scripted, "/v1/partitions/x/release", "POST", b"{}")
    assert status == 400
    with pytest.raises(SidecarError) as refused:
        c.release(3, 1, "p")
    assert refused.value.status == 404
    with pytest.raises(SidecarError) as stale:
        c.release(1, 7, "p")
    assert stale.value.status == 409
    assert c.release(1, 11, "1700-5") is True
    assert scripted.released == {1: "1700-5"}
    assert [p.partition for p in c.assignment().partitions] == [0]
    wait("epoch 2 acknowledged", lambda: c.assignment().acked_epoch == 2)


def test_fenced_sidecar_reports_nothing_and_is_not_ready(scripted: Scripted) -> None:
    scripted.set(target=[0], epoch=1)
    c = SidecarClient(scripted.url)
    wait("ready", lambda: raw(scripted, "/readyz")[0] == 200)
    scripted.renewals_fail = True
    a = wait("fenced", lambda: (x := c.assignment()).fenced and x, timeout=10)
    assert a.partitions == ()
    assert raw(scripted, "/readyz")[0] == 503
    status, metrics = raw(scripted, "/metrics")
    assert status == 200
    assert re.search(r"^kgroup_sidecar_fencings_total\{[^}]*\} 1\.0$", metrics, re.M), metrics


def test_watch_calls_back_assigned_revoked_and_lost(scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    events: list[tuple[str, int]] = []
    stop = threading.Event()

    def on_revoked(p: Any) -> None:
        events.append(("revoked", p.partition))
        c.release(p.partition, p.token, "pos")

    t = threading.Thread(target=c.watch, kwargs=dict(
        on_assigned=lambda p: events.append(("assigned", p.partition)),
        on_revoked=on_revoked,
        on_lost=lambda p: events.append(("lost", p.partition)),
        stop=stop, wait=1.0), daemon=True)
    t.start()
    wait("assigned", lambda: ("assigned", 1) in events and ("assigned", 0) in events)
    scripted.set(target=[0], epoch=2)
    wait("released", lambda: scripted.released.get(1) == "pos")
    scripted.renewals_fail = True
    wait("lost", lambda: ("lost", 0) in events)
    stop.set()
    t.join(5)
    assert events.index(("revoked", 1)) > events.index(("assigned", 1))
    assert ("lost", 1) not in events  # released by the app: it left with a release


def test_async_client_reads_and_releases(scripted: Scripted) -> None:
    scripted.set(target=[2], epoch=1)

    async def scenario() -> tuple[list[int], bool, int]:
        async with AsyncSidecarClient(scripted.url) as c:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                a = await c.assignment()
                if a.partitions:
                    break
            parts = [p.partition for p in a.partitions]
            ok = await c.release(2, a.partitions[0].token, "9-0")
            try:
                await c.release(2, 99, None)
            except SidecarError as exc:
                return parts, ok, exc.status
            return parts, ok, 0

    parts, ok, status = asyncio.run(scenario())
    assert parts == [2] and ok and status in (404, 409)
    assert scripted.released[2] == "9-0"


def test_the_socket_file_is_group_writable_and_replaced_when_stale(scripted: Scripted) -> None:
    if scripted.socket_path is None:
        pytest.skip("TCP transport: no socket file")
    assert scripted.socket_path.stat().st_mode & 0o777 == 0o660
    scripted.close()  # a container restart leaves the file in the shared volume
    again = Scripted(scripted.socket_path)
    try:
        assert raw(again, "/healthz") == (200, {"ok": True})
    finally:
        again.close()
    scripted.close = lambda: None  # type: ignore[method-assign]


@pytest.mark.parametrize("url", ["unix://relative.sock", "https://127.0.0.1:1", "ftp://x",
                                 "http://127.0.0.1:8470/v1"])
def test_a_sidecar_url_the_client_cannot_use_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        SidecarClient(url)


def test_an_absent_socket_is_unreachable_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(SidecarError) as err:
        SidecarClient(f"unix://{tmp_path}/none.sock").assignment()
    assert err.value.status == 0


def test_the_exec_probe_reads_the_listen_address_and_fails_until_ready(
        scripted: Scripted, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    listen = scripted.url if scripted.socket_path else f"127.0.0.1:{scripted.port}"
    monkeypatch.setenv("KGROUP_LISTEN", listen)
    assert probe_main(["/healthz"]) == 0
    assert probe_main(["/readyz"]) == 1  # no target yet
    assert "503" in capsys.readouterr().out.splitlines()[-1]
    scripted.set(target=[0], epoch=1)
    wait("ready", lambda: probe_main(["/readyz"]) == 0)
    scripted.close()
    scripted.close = lambda: None  # type: ignore[method-assign]
    assert probe_main(["/healthz"]) == 1  # nobody listens
