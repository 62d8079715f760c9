"""Rebalance figures on the real API server: real sidecars, the real operator, audit trails.

Rule: timings live here, never in tests; this prints and returns figures, asserts nothing.
Group settings: ``stabilizationWindowSeconds: 0`` and lease 15 s / renew 5 s unless told
(``--defaults``: nothing given, the CRD's defaults apply, as a user gets them; ``--window``,
``--lease D/R`` set one). Every time comes from the
sidecars' audit lines (CLOCK_MONOTONIC, shared by every process on the host):

- join: from the new member's ``session`` line to the last ``acquire`` of a partition whose
  target owner changed, by its new owner; moves vs ``lower_bound_moves``; and every
  ``release``/``acquire`` of a partition whose owner did NOT change in that span (a pause
  of an unmoved partition: must be none);
- leave (SIGTERM) and crash (SIGKILL): from the signal to the departed member's last
  partition acquired by another member (a crash waits about one lease duration);
- burst (``--burst``, once, at the end): ``--burst`` members join 0.3 s apart; the
  rebalances it cost (epoch bumps), the partitions each moved (the operator's
  RebalanceStarted Events) against the lower bound of going there in one step, and the
  time from the first new session to Stable.

Members are separate ``kgroup-sidecar`` processes whose app acknowledges revocations at
once (``--members procs``), or the in-process swarm (``--members swarm``: the same sidecar
code, one process — used where 32 processes would not fit on 2 cores).

    .venv/bin/python bench/bench_rebalance.py [--partitions 64 --members 4 --rounds 10]
        [--crash-rounds 3] [--swarm] [--defaults | --window 5 --lease 15/5] [--burst 10]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage import Stage, pct, wait_until

from kgroup import constants as C
from kgroup.client import Partition, SidecarClient
from kgroup.core.assignors import Member, lower_bound_moves
from kgroup.core.ranges import parse_ranges
from kgroup_devcluster.swarm import Swarm
from kgroup_sidecar.testing import SidecarProcess, read_audit, safety_violations

Obj = dict[str, Any]


class Members(Protocol):
    audit_dir: Path
    ended_at: dict[str, float]
    kills: dict[str, list[float]]

    def join(self, pod: str) -> None: ...
    def leave(self, pod: str) -> float: ...
    def crash(self, pod: str) -> float: ...
    def close(self) -> None: ...


class Procs:
    """One kgroup-sidecar process per member, each with an app that acks at once."""

    def __init__(self, st: Stage) -> None:
        self.st = st
        self.audit_dir = st.workdir
        self.procs: dict[str, SidecarProcess] = {}
        self.stops: dict[str, threading.Event] = {}
        self.ended_at: dict[str, float] = {}
        self.kills: dict[str, list[float]] = {}

    def join(self, pod: str) -> None:
        sc = SidecarProcess(pod=pod, group=self.st.group, namespace=self.st.ns,
                            kubeconfig=str(self.st.cluster.kubeconfig), workdir=self.st.workdir,
                            grace=30.0).start()
        self.procs[pod] = sc
        stop = self.stops[pod] = threading.Event()
        app = SidecarClient(sc.url)

        def revoked(p: Partition) -> None:
            with contextlib.suppress(Exception):
                app.release(p.partition, p.token, None)

        threading.Thread(target=app.watch, daemon=True, kwargs=dict(
            on_assigned=lambda p: None, on_revoked=revoked, on_lost=lambda p: None,
            stop=stop, wait=2.0)).start()

    def leave(self, pod: str) -> float:
        sc = self.procs.pop(pod)
        t = time.monotonic()
        sc.terminate(60)
        self.stops.pop(pod).set()
        return t

    def crash(self, pod: str) -> float:
        sc = self.procs.pop(pod)
        sc.signal(signal.SIGKILL)
        self.stops.pop(pod).set()
        assert sc.killed_at is not None
        self.ended_at[pod] = sc.killed_at
        self.kills.setdefault(pod, []).append(sc.killed_at)
        return sc.killed_at

    def close(self) -> None:
        for pod, sc in list(self.procs.items()):
            self.stops[pod].set()
            sc.stop()


class Swarmed:
    def __init__(self, st: Stage) -> None:
        self.audit_dir = st.workdir / "audit"
        self.swarm = Swarm(kubeconfig=str(st.cluster.kubeconfig), namespace=st.ns,
                           group=st.group, audit_dir=self.audit_dir).start()
        self.ended_at = self.swarm.crashed_at
        self.kills: dict[str, list[float]] = {}

    def join(self, pod: str) -> None:
        self.swarm.add([pod])

    def leave(self, pod: str) -> float:
        t = time.monotonic()
        self.swarm.leave(pod)
        return t

    def crash(self, pod: str) -> float:
        at = self.swarm.crash(pod)
        self.kills.setdefault(pod, []).append(at)
        return at

    def close(self) -> None:
        self.swarm.close()


def audit(m: Members) -> list[Obj]:
    return read_audit(sorted(m.audit_dir.glob("audit-*.jsonl")))


def lives(records: list[Obj], kills: dict[str, list[float]]) -> tuple[list[Obj], dict[str, float]]:
    """One member name per process life: the same pod crashed and restarted N times is N+1
    members to the safety check, each ended at its own kill (``ended_at`` holds one time per
    name, so without this a first life would seem to own its partitions until the last kill)."""
    out: list[Obj] = []
    ended: dict[str, float] = {}
    for r in records:
        times = kills.get(r["member"])
        if not times:
            out.append(r)
            continue
        life = bisect.bisect_left(times, r["mono"])  # kills before this line
        name = f"{r['member']}#{life}"
        if life < len(times):
            ended[name] = times[life]
        out.append({**r, "member": name})
    return out, ended


def targets(status: Obj) -> dict[int, str]:
    return {p: member for member, r in (status.get("assignment") or {}).items()
            for p in parse_ranges(r)}


def join_round(st: Stage, m: Members, pod: str, n_after: int, partitions: int) -> Obj:
    before = st.stable_with(n_after - 1)
    assert before is not None
    owner_before = targets(before)
    current = {mem: parse_ranges(r) for mem, r in before["assignment"].items()}
    members = [Member(x) for x in [*current, pod]]
    bound = lower_bound_moves(partitions, members, current, owner_before)
    m.join(pod)
    after = wait_until("stable after join", lambda: st.stable_with(n_after), timeout=180)
    owner_after = targets(after)
    moved = {p for p in owner_after if owner_after[p] != owner_before.get(p)}
    recs = audit(m)
    session = max(r["mono"] for r in recs if r["member"] == pod and r["event"] == "session")
    done = max((r["mono"] for r in recs if r["event"] == "acquire" and r["partition"] in moved
                and r["member"] == owner_after[r["partition"]] and r["mono"] >= session),
               default=session)
    pauses = [r for r in recs if session <= r["mono"] <= done + 1.0
              and r["event"] in ("acquire", "release", "lost")
              and r["partition"] is not None and r["partition"] not in moved]
    return {"seconds": done - session, "moved": len(moved), "lower_bound": bound,
            "unmoved_pauses": len(pauses)}


def depart_round(st: Stage, m: Members, pod: str, n_after: int, *, crash: bool) -> float:
    before = st.stable_with(n_after + 1)
    assert before is not None
    mine = set(parse_ranges(before["assignment"][pod]))
    t0 = m.crash(pod) if crash else m.leave(pod)
    wait_until("stable after departure", lambda: st.stable_with(n_after),
               timeout=180 if crash else 120)
    recs = audit(m)
    last = max(r["mono"] for r in recs if r["event"] == "acquire" and r["partition"] in mine
               and r["member"] != pod and r["mono"] >= t0)
    return float(last - t0)


_STARTED = re.compile(r"^epoch (\d+): .* \((\d+) partitions move\)$")


def rebalances(st: Stage, after_epoch: int) -> list[tuple[int, int]]:
    """(epoch, partitions moved) of each RebalanceStarted Event above ``after_epoch``."""
    listing: Any = st.core.list_namespaced_event(
        st.ns, field_selector=f"involvedObject.name={st.group},reason=RebalanceStarted")
    out = set()
    for ev in listing.items:
        m = _STARTED.match(ev.message or "")
        if m and int(m[1]) > after_epoch:
            out.add((int(m[1]), int(m[2])))
    return sorted(out)


def burst_round(st: Stage, m: Members, pods: list[str], n_before: int, partitions: int,
                gap: float = 0.3) -> Obj:
    before = st.stable_with(n_before)
    assert before is not None
    current = {mem: parse_ranges(r) for mem, r in before["assignment"].items()}
    bound = lower_bound_moves(partitions, [Member(x) for x in [*current, *pods]], current,
                              targets(before))
    for pod in pods:
        m.join(pod)
        time.sleep(gap)
    after = wait_until("stable after burst", lambda: st.stable_with(n_before + len(pods)),
                       timeout=300, interval=0.2)
    recs = audit(m)
    sessions = [max(r["mono"] for r in recs if r["member"] == p and r["event"] == "session")
                for p in pods]
    last_acquire = max(r["mono"] for r in recs if r["event"] == "acquire")
    moved = wait_until("rebalance Events", lambda: (
        r if len(r := rebalances(st, before["epoch"])) >= after["epoch"] - before["epoch"]
        else None), timeout=30)
    return {"joins": len(pods), "join_spread_s": max(sessions) - min(sessions),
            "rebalances": after["epoch"] - before["epoch"],
            "moved_per_rebalance": [n for _, n in moved],
            "moved_total": sum(n for _, n in moved), "one_step_lower_bound": bound,
            "first_session_to_owned_s": last_acquire - min(sessions)}


def run(*, partitions: int, members: int, rounds: int, crash_rounds: int, swarm: bool,
        settings: Obj | None = None, burst: int = 0) -> Obj:
    """``settings``: ``Stage.create_group`` keywords (None: window 0, lease 15/5)."""
    settings = settings or {}
    st = Stage("bench-rebalance")
    m: Members | None = None
    try:
        pods = [f"w-{i}" for i in range(members + 1)]
        extra_pods = [f"b-{i}" for i in range(burst)]
        st.pods(pods + extra_pods)
        st.create_group(partitions=partitions, **settings)
        spec = st.custom.get_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, st.ns, C.PLURAL, st.group)["spec"]
        st.start_operator()
        m = Swarmed(st) if swarm else Procs(st)
        for pod in pods[:members]:
            m.join(pod)
        t0 = time.monotonic()
        wait_until("initial Stable", lambda: st.stable_with(members), timeout=600, interval=0.5)
        initial = time.monotonic() - t0
        joins: list[Obj] = []
        leaves: list[float] = []
        crashes: list[float] = []
        extra = pods[members]
        for i in range(rounds):
            joins.append(join_round(st, m, extra, members + 1, partitions))
            if i < crash_rounds:
                crashes.append(depart_round(st, m, extra, members, crash=True))
            else:
                leaves.append(depart_round(st, m, extra, members, crash=False))
            print(f"  round {i + 1}: join {joins[-1]['seconds']:.2f} s "
                  f"(moved {joins[-1]['moved']}, bound {joins[-1]['lower_bound']}, "
                  f"unmoved pauses {joins[-1]['unmoved_pauses']})"
                  + (f", crash {crashes[-1]:.2f} s" if i < crash_rounds
                     else f", leave {leaves[-1]:.2f} s"), flush=True)
        burst_result = burst_round(st, m, extra_pods, members, partitions) if burst else None
        if burst_result is not None:
            print(f"  burst: {burst_result}", flush=True)
        recs, ended = lives(audit(m), m.kills)
        violations = safety_violations(recs, ended_at=ended)
        for line in violations[:5]:
            print(f"  SAFETY: {line}", flush=True)
        js = [j["seconds"] for j in joins]
        return {
            "partitions": partitions, "members": f"{members}->{members + 1}",
            "mode": "swarm (one process)" if swarm else "one process per sidecar",
            "window_seconds": spec["stabilizationWindowSeconds"],
            "lease": f"{spec['lease']['durationSeconds']} s / renew "
                     f"{spec['lease']['renewIntervalSeconds']} s",
            "settings": "CRD defaults" if settings and not any(settings.values())
                        else "given", "initial_stable_s": initial,
            "join_p50_s": pct(js, 0.5), "join_p95_s": pct(js, 0.95), "join_runs": len(js),
            "moved": sorted({j["moved"] for j in joins}),
            "lower_bound": sorted({j["lower_bound"] for j in joins}),
            "moved_minus_bound_max": max(j["moved"] - j["lower_bound"] for j in joins),
            "unmoved_pauses": sum(j["unmoved_pauses"] for j in joins),
            "leave_p50_s": pct(leaves, 0.5), "leave_p95_s": pct(leaves, 0.95),
            "leave_runs": len(leaves),
            "crash_p50_s": pct(crashes, 0.5), "crash_p95_s": pct(crashes, 0.95),
            "crash_max_s": max(crashes, default=float("nan")),
            "crash_runs": len(crashes), "burst": burst_result,
            "safety_violations": len(violations),
            "joins": js, "leaves": leaves, "crashes": crashes,
        }
    finally:
        if m is not None:
            m.close()
        st.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--crash-rounds", type=int, default=3)
    ap.add_argument("--swarm", action="store_true", help="in-process swarm, not processes")
    ap.add_argument("--defaults", action="store_true",
                    help="create the group with the CRD's defaults (window, lease, drain)")
    ap.add_argument("--window", type=int, help="stabilizationWindowSeconds (default 0)")
    ap.add_argument("--lease", help="durationSeconds/renewIntervalSeconds (default 15/5)")
    ap.add_argument("--burst", type=int, default=0, help="members joining 0.3 s apart, once")
    args = ap.parse_args()
    settings: Obj = {"window": None, "duration": None, "renew": None, "drain": None} \
        if args.defaults else {}
    if args.window is not None:
        settings["window"] = args.window
    if args.lease:
        duration, renew = (int(x) for x in args.lease.split("/"))
        settings.update(duration=duration, renew=renew)
    result = run(partitions=args.partitions, members=args.members, rounds=args.rounds,
                 crash_rounds=args.crash_rounds, swarm=args.swarm, settings=settings,
                 burst=args.burst)
    print(json.dumps({k: v for k, v in result.items()
                      if k not in ("joins", "leaves", "crashes")}, indent=1))


if __name__ == "__main__":
    main()
