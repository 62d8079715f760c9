"""Test and benchmark harness: real sidecar processes, a scripted target, a safety audit.

Used by ``e2e/tests/test_sidecar*.py`` and ``bench/bench_sidecar.py``. The scripted target
plays the operator's part (create the group, its partition Leases with no holder, and
write ``status.epoch`` + ``status.assignment``), so the sidecar is tested on its own
against a real API server. The audit checker reads the sidecars' ``KGROUP_AUDIT_FILE``
lines and proves the safety promise: per partition, no two sessions' active-ownership
intervals overlap, and tokens strictly increase.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from kgroup.constants import (
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSIGNED_UID,
    API_GROUP,
    API_VERSION,
    KIND,
    LABEL_GROUP,
    LABEL_PARTITION,
    LABEL_ROLE,
    PLURAL,
    ROLE_PARTITION,
    partition_lease_name,
)
from kgroup.core.lease_codec import expiry_patch
from kgroup.core.objects import Obj
from kgroup.core.ranges import format_ranges


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def sidecar_command() -> list[str]:
    exe = Path(sys.executable).with_name("kgroup-sidecar")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "kgroup_sidecar.main"]


@dataclass
class SidecarProcess:
    """One ``kgroup-sidecar`` process with its own port, audit file and log."""

    pod: str
    group: str
    namespace: str
    kubeconfig: str
    workdir: Path
    grace: float = 20.0
    port: int = field(default_factory=free_port)
    unix_socket: bool = False  # serve on <workdir>/<pod>.sock instead of the port
    proc: subprocess.Popen[bytes] | None = None
    killed_at: float | None = None
    env: dict[str, str] = field(default_factory=dict)  # more environment, applied last
    command: list[str] | None = None  # the program (default: sidecar_command())

    @property
    def listen(self) -> str:
        """KGROUP_LISTEN of the process."""
        if self.unix_socket:
            return f"unix://{self.workdir / f'{self.pod}.sock'}"
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.listen if self.unix_socket else f"http://{self.listen}"

    @property
    def audit_file(self) -> Path:
        return self.workdir / f"audit-{self.pod}.jsonl"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"sidecar-{self.pod}.log"

    def start(self) -> SidecarProcess:
        env = {
            **os.environ,
            "KGROUP_GROUP": self.group,
            "KGROUP_NAMESPACE": self.namespace,
            "KGROUP_POD_NAME": self.pod,
            "KGROUP_LISTEN": self.listen,
            "KUBECONFIG": self.kubeconfig,
            "KGROUP_AUDIT_FILE": str(self.audit_file),
            "KGROUP_LOG_LEVEL": "DEBUG",
            "KGROUP_TERMINATION_GRACE_SECONDS": str(self.grace),
            # no app gate unless a test sets one: the harness's scripted app may never ask
            "KGROUP_APP_TIMEOUT_SECONDS": "0",
            "NO_PROXY": "127.0.0.1,localhost",
            **self.env,
        }
        log = open(self.log_file, "ab")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(self.command or sidecar_command(), env=env, stdout=log,
                                     stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        self.killed_at = None
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)
            self.killed_at = time.monotonic()

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Cleanup: whatever state it is in, make sure the process is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.killed_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


class ScriptedTarget:
    """Plays the operator: the group, its partition Leases, and the target in status."""

    def __init__(self, api: client.ApiClient, namespace: str, group: str) -> None:
        self.api = api
        self.namespace = namespace
        self.group = group
        self.custom: Any = client.CustomObjectsApi(api)
        self.leases: Any = client.CoordinationV1Api(api)
        self.epoch = 0
        self.uid = ""
        # member -> its pod's uid, marked with it (kgroup.dev/assigned-uid) as the operator
        # does; a sidecar started with KGROUP_POD_UID acquires only a lock marked for it
        self.pod_uids: dict[str, str] = {}

    def create(self, *, partitions: int, duration: int = 3, renew: int = 1,
               drain: int = 10) -> Obj:
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "metadata": {"name": self.group, "namespace": self.namespace},
            "spec": {
                "partitions": partitions,
                "selector": {"matchLabels": {"app": self.group}},
                "lease": {"durationSeconds": duration, "renewIntervalSeconds": renew},
                "handoff": {"drainTimeoutSeconds": drain},
            },
        }
        obj: Obj = self.custom.create_namespaced_custom_object(
            API_GROUP, API_VERSION, self.namespace, PLURAL, body)
        self.uid = obj["metadata"]["uid"]
        for p in range(partitions):
            self.leases.create_namespaced_lease(self.namespace, {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": partition_lease_name(self.group, p),
                    "labels": {LABEL_GROUP: self.group, LABEL_ROLE: ROLE_PARTITION,
                               LABEL_PARTITION: str(p)},
                    "ownerReferences": [{"apiVersion": f"{API_GROUP}/{API_VERSION}",
                                         "kind": KIND, "name": self.group, "uid": self.uid}],
                },
                "spec": {"leaseTransitions": 0, "leaseDurationSeconds": duration},
            })
        return obj

    def assign(self, assignment: Mapping[str, Sequence[int]], *, mark: bool = True) -> int:
        """Write a new target with the next epoch through the status subresource, then (as
        the operator does, after the status write) mark each lock whose owner changed
        (``kgroup.dev/assigned``): a sidecar acquires only a lock marked for it."""
        self.epoch += 1
        status = {"epoch": self.epoch,
                  "assignment": {m: format_ranges(ps) for m, ps in assignment.items()}}
        self.custom.patch_namespaced_custom_object_status(
            API_GROUP, API_VERSION, self.namespace, PLURAL, self.group,
            {"status": status})
        if mark:
            for member, partitions in assignment.items():
                for p in partitions:
                    self.mark(p, member)
        return self.epoch

    def mark(self, partition: int, member: str) -> None:
        """The operator's one write per moved partition: a merge patch of the mark (and of
        the member's pod uid, when :attr:`pod_uids` knows it)."""
        uid = self.pod_uids.get(member)
        notes = self.lock(partition)["metadata"].get("annotations") or {}
        if notes.get(ANNOTATION_ASSIGNED) == member and notes.get(ANNOTATION_ASSIGNED_UID) == uid:
            return
        self.leases.patch_namespaced_lease(
            partition_lease_name(self.group, partition), self.namespace,
            {"metadata": {"annotations": {ANNOTATION_ASSIGNED: member,
                                          ANNOTATION_ASSIGNED_UID: uid}}})

    def expire_when_silent(self, member: str, duration: float, *,
                           timeout: float = 60.0) -> list[int]:
        """The operator's failure detection, played: watch ``member``'s Lease (by polling)
        until it has not changed for ``duration`` seconds on this clock (first sight starts
        the clock), re-read it, then mark each lock its session holds expired
        (``kgroup.dev/expired-session``, a merge patch conditional on the lock's
        resourceVersion). The locks marked."""
        deadline = time.monotonic() + timeout
        seen: tuple[str, str] | None = None  # (resourceVersion, session)
        since = time.monotonic()
        while True:
            lease = self.member_lease(member)
            now = time.monotonic()
            current = None if lease is None else (
                lease["metadata"]["resourceVersion"],
                (lease["metadata"].get("annotations") or {}).get("kgroup.dev/session", ""))
            if current != seen:
                seen, since = current, now
            if seen is None or now - since >= duration:
                break
            if now > deadline:
                raise TimeoutError(f"{member} kept renewing for {timeout}s")
            time.sleep(0.1)
        selector = f"{LABEL_GROUP}={self.group},{LABEL_ROLE}={ROLE_PARTITION}"
        raw = self.leases.list_namespaced_lease(self.namespace, label_selector=selector,
                                                _preload_content=False)
        marked = []
        for item in json.loads(raw.data)["items"]:
            # its session is over (silent a full duration), and any older one of its too
            lock_session = (item["metadata"].get("annotations") or {}).get("kgroup.dev/session")
            if (item.get("spec") or {}).get("holderIdentity") != member or not lock_session:
                continue
            self.leases.patch_namespaced_lease(
                item["metadata"]["name"], self.namespace,
                expiry_patch(lock_session, item["metadata"]["resourceVersion"]))
            marked.append(int(item["metadata"]["labels"][LABEL_PARTITION]))
        return sorted(marked)

    def lock(self, partition: int) -> Obj:
        raw = self.leases.read_namespaced_lease(
            partition_lease_name(self.group, partition), self.namespace,
            _preload_content=False)
        result: Obj = json.loads(raw.data)
        return result

    def holder(self, partition: int) -> tuple[str | None, str | None, int]:
        """(holder, session, acquisitions so far: ``leaseTransitions``)."""
        obj = self.lock(partition)
        spec = obj.get("spec") or {}
        notes = obj["metadata"].get("annotations") or {}
        return (spec.get("holderIdentity"), notes.get("kgroup.dev/session"),
                int(spec.get("leaseTransitions") or 0))

    def token(self, partition: int) -> int:
        """The lock's fencing token (``kgroup.dev/token``; 0: never acquired)."""
        notes = self.lock(partition)["metadata"].get("annotations") or {}
        return int(notes.get("kgroup.dev/token") or 0)

    def member_lease(self, member: str) -> Obj | None:
        try:
            raw = self.leases.read_namespaced_lease(
                f"{self.group}-member-{member}", self.namespace, _preload_content=False)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: Obj = json.loads(raw.data)
        return result


# ---- the safety audit ---------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    member: str
    session: str
    partition: int
    token: int
    start: float
    end: float


def read_audit(paths: Sequence[Path]) -> list[Obj]:
    records: list[Obj] = []
    for path in paths:
        if path.exists():
            records.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return records


def ownership_intervals(records: Sequence[Obj], *, ended_at: Mapping[str, float] | None = None,
                        now: float | None = None) -> list[Interval]:
    """Active-ownership intervals per (session, partition, token).

    Ends at the release line, the fence's ``until``, a ``lost`` line, the process's kill
    time (``ended_at`` by member: it ends the member's sessions begun by then, not one a
    restarted process began after it), or ``now`` for owners still running."""
    now = time.monotonic() if now is None else now
    ended_at = ended_at or {}
    open_: dict[tuple[str, int], Obj] = {}
    out: list[Interval] = []
    begun: dict[str, float] = {}  # session -> its first line

    def close(key: tuple[str, int], end: float) -> None:
        rec = open_.pop(key)
        out.append(Interval(rec["member"], rec["session"], rec["partition"], rec["token"],
                            rec["mono"], max(rec["mono"], end)))

    for rec in sorted(records, key=lambda r: float(r["mono"])):
        event, session = rec["event"], rec["session"]
        begun.setdefault(session, float(rec["mono"]))
        if event == "acquire":
            open_[(session, rec["partition"])] = rec
        elif event in ("release", "lost") and (session, rec["partition"]) in open_:
            close((session, rec["partition"]), float(rec["mono"]))
        elif event == "fence":
            for key in [k for k in open_ if k[0] == session]:
                close(key, float(rec["until"]))
    for key, rec in list(open_.items()):
        killed = ended_at.get(rec["member"])
        close(key, killed if killed is not None and begun[key[0]] <= killed else now)
    return out


def safety_violations(records: Sequence[Obj], *, ended_at: Mapping[str, float] | None = None,
                      now: float | None = None) -> list[str]:
    """Every breach of the safety promise found in the audit lines (empty: none)."""
    return interval_violations(ownership_intervals(records, ended_at=ended_at, now=now))


def interval_violations(intervals: Sequence[Interval]) -> list[str]:
    """Per partition: two sessions' active-ownership intervals overlapping, or a token not
    above the one before it (empty: none)."""
    problems: list[str] = []
    by_partition: dict[int, list[Interval]] = {}
    for iv in intervals:
        by_partition.setdefault(iv.partition, []).append(iv)
    for p, ivs in sorted(by_partition.items()):
        ivs.sort(key=lambda iv: iv.start)
        latest: Interval | None = None  # the interval reaching furthest so far
        for prev, b in zip([None, *ivs], ivs, strict=False):
            if latest is not None and b.start < latest.end and latest.session != b.session:
                problems.append(
                    f"partition {p}: {latest.member}/{latest.session} (token {latest.token}) "
                    f"active until {latest.end:.3f} overlaps {b.member}/{b.session} "
                    f"(token {b.token}) from {b.start:.3f}")
            if prev is not None and b.token <= prev.token:
                problems.append(f"partition {p}: token {b.token} of {b.member} after token "
                                f"{prev.token} of {prev.member}")
            if latest is None or b.end > latest.end:
                latest = b
    return problems


def handoff_figures(intervals: list[Interval], partitions: int, t0: float,
                    t1: float) -> dict[str, float]:
    """Moves, most unowned at once and the longest pause in [t0, t1] (e.g. a rollout).

    A move is a partition's next owner being another member; a pause is the gap between
    one owner's end and the next owner's start; unowned is counted at every instant an
    owner starts or ends (the only instants the count changes)."""
    by_p: dict[int, list[Interval]] = {p: [] for p in range(partitions)}
    for iv in intervals:
        if iv.end > t0 and iv.start < t1:
            by_p[iv.partition].append(iv)
    moves, longest = 0, 0.0
    for ivs in by_p.values():
        ivs.sort(key=lambda iv: iv.start)
        for a, b in itertools.pairwise(ivs):
            moves += a.member != b.member
            longest = max(longest, b.start - a.end)
    instants = sorted({t0} | {t for ivs in by_p.values() for iv in ivs
                              for t in (iv.start, iv.end) if t0 <= t < t1})
    most = max(sum(1 for ivs in by_p.values() if not any(iv.start <= t < iv.end for iv in ivs))
               for t in instants)
    return {"moves": moves, "moves_per_partition": moves / partitions,
            "max_unowned": most, "longest_pause_s": longest}


def wait_until(what: str, condition: Callable[[], Any], *, timeout: float = 60.0,
               interval: float = 0.1) -> Any:
    """Poll ``condition`` until truthy (returned); raise AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except Exception as exc:  # transient: the API server or a sidecar restarting
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
