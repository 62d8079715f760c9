"""The sidecar on the real local API server, with real sidecar processes and a scripted
target (the test plays the operator). Every test ends with the safety audit: per
partition, no two sessions' active-ownership intervals overlap and tokens increase.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kgroup.client import SidecarClient, SidecarError
from kgroup_devcluster.cluster import Cluster
from kgroup_sidecar.probe import probe
from kgroup_testing.sidecar_harness import (
    ScriptedTarget,
    SidecarProcess,
    read_audit,
    safety_violations,
    wait_until,
)

pytestmark = pytest.mark.cluster
GROUP = "orders"


class Harness:
    def __init__(self, kube: client.ApiClient, namespace: str, kubeconfig: str,
                 workdir: Path) -> None:
        self.target = ScriptedTarget(kube, namespace, GROUP)
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.sidecars: dict[str, SidecarProcess] = {}

    def start(self, pod: str, *, unix_socket: bool = False) -> SidecarProcess:
        sc = SidecarProcess(pod=pod, group=GROUP, namespace=self.namespace,
                            kubeconfig=self.kubeconfig, workdir=self.workdir,
                            unix_socket=unix_socket).start()
        self.sidecars[pod] = sc
        return sc

    def client(self, pod: str) -> SidecarClient:
        return SidecarClient(self.sidecars[pod].url)

    def view(self, pod: str) -> dict[int, tuple[str, int]]:
        a = self.client(pod).assignment()
        return {p.partition: (p.state, p.token) for p in a.partitions}

    def acked(self, pod: str, epoch: int) -> bool:
        a = self.client(pod).assignment()
        return a.acked_epoch == epoch

    def converged(self, assignment: dict[str, list[int]], epoch: int) -> bool:
        for pod, parts in assignment.items():
            a = self.client(pod).assignment()
            if a.acked_epoch != epoch or sorted(p.partition for p in a.active) != sorted(parts):
                return False
        return True

    def audit(self) -> list[str]:
        files = [sc.audit_file for sc in self.sidecars.values()]
        ended = {pod: sc.killed_at for pod, sc in self.sidecars.items()
                 if sc.killed_at is not None}
        return safety_violations(read_audit(files), ended_at=ended)

    def logs(self) -> str:
        return "\n".join(f"--- {pod}\n{sc.log_text()[-4000:]}"
                         for pod, sc in self.sidecars.items())


@pytest.fixture
def harness(cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
            tmp_path: Path) -> Iterator[Harness]:
    h = Harness(kube, namespace, str(cluster.kubeconfig), tmp_path)
    try:
        yield h
    finally:
        for sc in h.sidecars.values():
            sc.stop()
    problems = h.audit()
    assert not problems, "\n".join(problems) + "\n" + h.logs()
    for sc in h.sidecars.values():
        assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def test_two_members_join_split_the_target_and_acknowledge(harness: Harness) -> None:
    h = harness
    h.target.create(partitions=4)
    h.start("pod-a")
    h.start("pod-b")
    target = {"pod-a": [0, 1], "pod-b": [2, 3]}
    epoch = h.target.assign(target)
    wait_until("both members converge and ack", lambda: h.converged(target, epoch), timeout=30)
    for p, pod in ((0, "pod-a"), (1, "pod-a"), (2, "pod-b"), (3, "pod-b")):
        holder, session, token = h.target.holder(p)
        assert (holder, token) == (pod, 1)
        assert session == h.client(pod).assignment().session
    lease = h.target.member_lease("pod-a")
    assert lease is not None
    assert lease["metadata"]["annotations"]["kgroup.dev/epoch"] == str(epoch)
    assert lease["metadata"]["ownerReferences"][0]["uid"] == h.target.uid


def _readiness(h: Harness, pod: str) -> tuple[bool, str]:
    """What /readyz answers (the chart's httpGet readiness probe asks the same)."""
    return probe("/readyz", h.sidecars[pod].listen)


def _ready_when(h: Harness, pod: str, ready: bool, reason: str, *, timeout: float = 30) -> None:
    wait_until(f"{pod} {'ready' if ready else 'not ready'}: {reason}",
               lambda: (r := _readiness(h, pod))[0] is ready and reason in r[1],
               timeout=timeout)


def test_readiness_follows_ownership_over_a_unix_socket(harness: Harness) -> None:
    """Ready = holds the whole target and acknowledged its epoch: a pod not admitted yet is
    not Ready, the first pod becomes Ready once it holds everything, a pod that drains a
    revoked partition is not Ready, and a member with an empty target is Ready."""
    h = harness
    h.target.create(partitions=4, drain=4)
    h.start("pod-a", unix_socket=True)
    h.start("pod-b", unix_socket=True)
    assert h.sidecars["pod-a"].url.startswith("unix://")
    _ready_when(h, "pod-a", False, "no target yet")
    one = h.target.assign({"pod-a": [0, 1, 2, 3]})
    _ready_when(h, "pod-a", True, f"holds its target of epoch {one}")
    assert h.acked("pod-a", one) and len(h.view("pod-a")) == 4
    _ready_when(h, "pod-b", False, f"not a member of epoch {one}")
    two = h.target.assign({"pod-a": [0, 1], "pod-b": [2, 3]})
    # pod-a drains 2 and 3 (nobody acknowledges: the drain timeout releases them), and
    # pod-b cannot take them before that: neither is Ready meanwhile.
    _ready_when(h, "pod-a", False, "draining 2")
    _ready_when(h, "pod-b", False, "holds 0 of 2")
    _ready_when(h, "pod-b", True, f"epoch {two}")
    _ready_when(h, "pod-a", True, f"epoch {two}")
    assert h.converged({"pod-a": [0, 1], "pod-b": [2, 3]}, two)
    three = h.target.assign({"pod-a": [0, 1, 2, 3], "pod-b": []})
    _ready_when(h, "pod-a", True, f"epoch {three}")
    _ready_when(h, "pod-b", True, f"epoch {three}")  # its whole, empty, target
    assert h.view("pod-b") == {}


def _converge(h: Harness, target: dict[str, list[int]]) -> int:
    epoch = h.target.assign(target)
    wait_until(f"members converge on epoch {epoch}", lambda: h.converged(target, epoch),
               timeout=40)
    return epoch


def test_graceful_move_hands_over_the_position_with_a_higher_token(harness: Harness) -> None:
    h = harness
    h.target.create(partitions=4)
    h.start("pod-a")
    h.start("pod-b")
    _converge(h, {"pod-a": [0, 1], "pod-b": [2, 3]})
    app_a = h.client("pod-a")
    epoch = h.target.assign({"pod-a": [0], "pod-b": [1, 2, 3]})
    revoking = wait_until("partition 1 revoking on pod-a", lambda: [
        p for p in app_a.assignment().partitions if p.state == "revoking"])
    t0, t1 = h.target.token(0), h.target.token(1)  # the resourceVersions they replaced
    assert [(p.partition, p.token) for p in revoking] == [(1, t1)]
    assert h.view("pod-a")[0] == ("active", t0)  # the partition that stays is not disturbed
    assert h.view("pod-b").get(1) is None  # the new owner waits for the release
    assert app_a.release(1, t1, "1700-5") is True
    wait_until("both ack the new epoch", lambda: h.converged(
        {"pod-a": [0], "pod-b": [1, 2, 3]}, epoch), timeout=30)
    moved = {p.partition: p for p in h.client("pod-b").assignment().partitions}[1]
    assert (moved.token, moved.position) == (h.target.token(1), "1700-5")
    assert moved.token > t1
    lock = h.target.lock(1)
    assert lock["metadata"]["annotations"]["kgroup.dev/position-token"] == str(t1)
    assert lock["spec"]["leaseTransitions"] == 2  # two acquisitions


def test_sigterm_releases_everything_with_positions_and_deletes_the_session(
        harness: Harness) -> None:
    h = harness
    h.target.create(partitions=2)
    sc = h.start("pod-a")
    _converge(h, {"pod-a": [0, 1]})
    app = h.client("pod-a")
    sc.signal(signal.SIGTERM)
    released: set[int] = set()

    def ack_revocations() -> bool:
        if not sc.alive():
            return True
        for p in app.assignment().partitions:
            if p.state == "revoking" and p.partition not in released:
                app.release(p.partition, p.token, f"pos-{p.partition}")
                released.add(p.partition)
        return False

    wait_until("the sidecar exits", ack_revocations, timeout=30)
    assert sc.proc is not None and sc.proc.returncode == 0
    assert released == {0, 1}
    for p in (0, 1):
        holder, session, token = h.target.holder(p)
        notes = h.target.lock(p)["metadata"]["annotations"]
        assert (holder, session, token) == (None, None, 1)
        assert notes["kgroup.dev/position"] == f"pos-{p}"
    assert h.target.member_lease("pod-a") is None


def test_sigkill_lets_another_member_take_over_after_a_lease_duration(harness: Harness) -> None:
    h = harness
    h.target.create(partitions=4)
    a = h.start("pod-a")
    h.start("pod-b")
    _converge(h, {"pod-a": [0, 1], "pod-b": [2, 3]})
    before = {p: h.target.token(p) for p in range(4)}
    a.signal(signal.SIGKILL)
    epoch = h.target.assign({"pod-b": [0, 1, 2, 3]})
    # pod-b watches no member Lease: assigned the dead holder's locks, it waits for the
    # operator's expiry mark (the test plays the operator: silent a full duration, re-read)
    time.sleep(4.0)  # more than the lease duration (3 s) after the kill
    assert sorted(h.view("pod-b")) == [2, 3]
    assert h.target.expire_when_silent("pod-a", 3.0) == [0, 1]
    wait_until("pod-b owns everything", lambda: h.converged({"pod-b": [0, 1, 2, 3]}, epoch),
               timeout=40)
    after = {p: t for p, (_, t) in h.view("pod-b").items()}
    assert after == {p: h.target.token(p) for p in range(4)}
    assert [after[p] > before[p] for p in range(4)] == [True, True, False, False]
    assert [h.target.holder(p)[2] for p in range(4)] == [2, 2, 1, 1]  # acquisitions
    takeovers = [r for r in read_audit([h.sidecars["pod-b"].audit_file])
                 if r["event"] == "acquire" and r["partition"] in (0, 1)]
    assert a.killed_at is not None
    # Safety floor, not a speed check: pod-a's last renewal was sent at most one renew
    # interval (1 s) before the kill, and the mark waits a full duration (3 s) after it.
    assert len(takeovers) == 2 and all(r["mono"] >= a.killed_at + 1.5 for r in takeovers)


def test_sigstop_longer_than_the_lease_fences_the_paused_member(harness: Harness) -> None:
    h = harness
    h.target.create(partitions=4)
    a = h.start("pod-a")
    h.start("pod-b")
    _converge(h, {"pod-a": [0, 1], "pod-b": [2, 3]})
    app_a = h.client("pod-a")
    before = app_a.assignment()
    old_tokens = {p.partition: p.token for p in before.partitions}
    a.signal(signal.SIGSTOP)
    try:
        epoch = h.target.assign({"pod-b": [0, 1, 2, 3]})
        assert h.target.expire_when_silent("pod-a", 3.0) == [0, 1]  # the operator's part
        wait_until("pod-b takes over", lambda: h.converged({"pod-b": [0, 1, 2, 3]}, epoch),
                   timeout=40)
        # While paused, the app's last answer has run out on the app's own clock.
        assert before.expired and before.partitions == ()
    finally:
        a.signal(signal.SIGCONT)
    after = wait_until("pod-a answers again", lambda: app_a.assignment())
    assert after.partitions == ()
    # The answer may come before the fence's audit line: on a kept-alive connection the
    # request can be served in the same loop turn as the overdue fencing step. The view
    # already excluded the lapsed partitions (checked above); the fence line follows.
    fences = wait_until("pod-a's fence is audited", lambda: [
        r for r in read_audit([a.audit_file]) if r["event"] == "fence"], timeout=10)
    assert sorted(p for p, _ in fences[0]["partitions"]) == [0, 1]
    new_tokens = {p: t for p, (_, t) in h.view("pod-b").items()}
    assert all(old_tokens[p] < new_tokens[p] for p in (0, 1))
    with pytest.raises(SidecarError) as stale:
        app_a.release(0, old_tokens[0], "zombie")
    assert stale.value.status == 404
    wait_until("pod-a rejoins with a new session",
               lambda: (x := app_a.assignment()).session not in (None, before.session)
               and not x.fenced)


def test_drain_timeout_releases_a_partition_the_app_never_acknowledges(
        harness: Harness) -> None:
    h = harness
    h.target.create(partitions=2, drain=2)
    h.start("pod-a")
    h.start("pod-b")
    _converge(h, {"pod-a": [0, 1], "pod-b": []})
    epoch = h.target.assign({"pod-a": [0], "pod-b": [1]})
    wait_until("the partition moves without an ack", lambda: h.converged(
        {"pod-a": [0], "pod-b": [1]}, epoch), timeout=30)
    releases = [r for r in read_audit([h.sidecars["pod-a"].audit_file])
                if r["event"] == "release"]
    assert [(r["partition"], r["reason"], r["position"]) for r in releases] == [
        (1, "drain-timeout", None)]
    assert h.view("pod-b")[1] == ("active", h.target.token(1))
    assert h.target.holder(1)[2] == 2  # a second acquisition


def test_api_server_restart_keeps_or_fences_then_converges(harness: Harness,
                                                            cluster: Cluster) -> None:
    h = harness
    h.target.create(partitions=4)
    h.start("pod-a")
    h.start("pod-b")
    target = {"pod-a": [0, 1], "pod-b": [2, 3]}
    epoch = _converge(h, target)
    cluster.restart_apiserver()
    wait_until("members converge after the restart", lambda: h.converged(target, epoch),
               timeout=60)
    epoch = h.target.assign({"pod-a": [0], "pod-b": [1, 2, 3]})
    app_a = h.client("pod-a")

    def ack() -> bool:
        for p in app_a.assignment().partitions:
            if p.state == "revoking":
                app_a.release(p.partition, p.token, "after-restart")
        return h.converged({"pod-a": [0], "pod-b": [1, 2, 3]}, epoch)

    wait_until("a move still works after the restart", ack, timeout=40)


def test_three_members_follow_a_series_of_targets_without_overlap(harness: Harness) -> None:
    h = harness
    h.target.create(partitions=6)
    pods = ["pod-a", "pod-b", "pod-c"]
    for pod in pods:
        h.start(pod)
    apps = {pod: h.client(pod) for pod in pods}

    def ack_all() -> None:
        for app in apps.values():
            for p in app.assignment().partitions:
                if p.state == "revoking":
                    app.release(p.partition, p.token, f"{p.partition}@{p.token}")

    targets = [
        {"pod-a": [0, 1, 2, 3, 4, 5], "pod-b": [], "pod-c": []},
        {"pod-a": [0, 1], "pod-b": [2, 3], "pod-c": [4, 5]},
        {"pod-a": [4, 5], "pod-b": [0, 1], "pod-c": [2, 3]},
        {"pod-a": [], "pod-b": [0, 1, 2], "pod-c": [3, 4, 5]},
    ]
    for target in targets:
        epoch = h.target.assign(target)

        def converged(target: dict[str, list[int]] = target, epoch: int = epoch) -> bool:
            ack_all()
            return h.converged(target, epoch)

        wait_until(f"epoch {epoch}", converged, timeout=40)
    # Each change of owner is one acquisition (a higher token) with the position handed over.
    for p in range(6):
        owners = [next(pod for pod, parts in t.items() if p in parts) for t in targets]
        moves = sum(1 for x, y in itertools.pairwise(owners) if x != y)
        holder, _, acquisitions = h.target.holder(p)
        assert (holder, acquisitions) == (owners[-1], 1 + moves)
        notes = h.target.lock(p)["metadata"]["annotations"]
        token = int(notes["kgroup.dev/token"])
        expected = f"{p}@{notes['kgroup.dev/position-token']}" if moves else None
        if moves:
            assert int(notes["kgroup.dev/position-token"]) < token
        view = {q.partition: q for q in apps[owners[-1]].assignment().partitions}
        assert (view[p].token, view[p].position) == (token, expected)


def test_a_completed_release_records_the_completion_on_the_lock(harness: Harness) -> None:
    """A sealed partition read to its seal marker and released with ``completed``: the
    real sidecar writes the release and ``kgroup.dev/completed`` (its token) in one
    update; an ordinary release of another partition records nothing, and a completion
    without its marker is refused before anything is written."""
    h = harness
    h.target.create(partitions=2)
    h.start("pod-a")
    _converge(h, {"pod-a": [0, 1]})
    app = h.client("pod-a")
    t0, t1 = h.target.token(0), h.target.token(1)
    with pytest.raises(SidecarError) as refused:
        app._request("POST", "/v1/partitions/0/release",
                     {"token": t0, "position": None, "completed": True}, timeout=10)
    assert refused.value.status == 400 and "seal marker" in str(refused.value)
    assert h.target.holder(0)[0] == "pod-a"  # nothing was written
    assert app.release(0, t0, "1700-9", completed=True) is True
    assert app.release(1, t1, "1700-4") is True
    done, plain = h.target.lock(0), h.target.lock(1)
    notes = done["metadata"]["annotations"]
    assert "holderIdentity" not in done["spec"]
    assert (notes["kgroup.dev/position"], notes["kgroup.dev/position-token"],
            notes["kgroup.dev/completed"]) == ("1700-9", str(t0), str(t0))
    assert "kgroup.dev/completed" not in plain["metadata"]["annotations"]
