"""Rebalance figures on the real API server: real sidecars, the real operator, audit trails.

Rule: timings live here, never in tests; this prints and returns figures, asserts nothing.
Each setting of ``--settings`` is one labelled run on a group of its own: ``defaults`` (the
group leaves every setting to the CRD's defaults: what a user gets) and ``window0`` (the
defaults but ``stabilizationWindowSeconds: 0``; lease 15 s / renew 5 s, drain 30 s). Every
time comes from the sidecars' audit lines (CLOCK_MONOTONIC, shared by every process on the
host):

- join: from the new member's ``session`` line to the last ``acquire`` of a partition whose
  target owner changed, by its new owner; moves vs ``lower_bound_moves``; and every
  ``release``/``acquire`` of a partition whose owner did NOT change in that span (a pause
  of an unmoved partition: must be none);
- leave (SIGTERM) and node loss (SIGKILL: the member stops renewing and is not
  restarted; its pod stays): from the signal to the departed member's last partition
  acquired by another member (a crash waits one lease duration, 15 s by default);
- burst (``--burst-rounds``): 10 members join within 3 s (one every 0.3 s): from the first
  join to the last moved partition acquired by its new owner, the rebalances it cost
  (epochs), moves vs the lower bound; then the 10 leave together (SIGTERM), timed alike.

Members are separate ``kgroup-sidecar`` processes whose app acknowledges revocations at
once (``--members procs``), or the in-process swarm (``--members swarm``: the same sidecar
code, one process — used where 32 processes would not fit on 2 cores).

    .venv/bin/python bench/bench_rebalance.py [--partitions 64 --members 4 --rounds 10]
        [--crash-rounds 3] [--burst-rounds 2] [--settings defaults,window0] [--swarm]
        [--quiet-before 12] [--out docs/bench/rebalance_defaults.json]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage import Stage, apiserver_requests, machine, pct, wait_until

from kgroup.client import Partition, SidecarClient
from kgroup.core.objects import Obj
from kgroup.core.operator.assignors import Assignee, lower_bound_moves
from kgroup.core.ranges import parse_ranges
from kgroup_devcluster.swarm import Swarm
from kgroup_testing.sidecar_harness import SidecarProcess, read_audit, safety_violations


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
    members = [Assignee(x) for x in [*current, pod]]
    bound = lower_bound_moves(partitions, members, current, owner_before)
    writes_before = apiserver_requests(st.cluster)
    m.join(pod)
    after = wait_until("stable after join", lambda: st.stable_with(n_after), timeout=180)
    writes = {verb: n - writes_before.get(verb, 0.0)
              for verb, n in apiserver_requests(st.cluster).items()
              if verb in ("POST", "PUT", "PATCH", "DELETE")}
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
            "unmoved_pauses": len(pauses), "lease_writes": writes,
            "acquires": sum(1 for r in recs if r["event"] == "acquire" and r["mono"] >= session
                            and r["mono"] <= done)}


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


BURST = 10
BURST_SPACING = 0.3  # s between two joins of a burst: 10 within 3 s
SETTINGS: dict[str, Obj] = {
    # a setting None is left out of the group: the CRD's default applies
    "defaults": {"window": None, "duration": None, "renew": None, "drain": None},
    "window0": {"window": 0, "duration": 15, "renew": 5, "drain": 30},
}


def group_settings(st: Stage) -> Obj:
    """The settings the API server stored (defaults filled in), as the figures' label."""
    spec = st.custom.get_namespaced_custom_object(
        "kgroup.dev", "v1alpha1", st.ns, "consumergroups", st.group)["spec"]
    return {k: spec.get(k) for k in ("stabilizationWindowSeconds",
                                     "stabilizationMaxDelaySeconds", "lease", "handoff",
                                     "restartGraceSeconds")}


def burst_round(st: Stage, m: Members, joiners: list[str], members: int,
                partitions: int) -> Obj:
    """BURST joins BURST_SPACING apart, then the same BURST leaving at once."""
    before = st.stable_with(members)
    assert before is not None
    owner_before = targets(before)
    current = {mem: parse_ranges(r) for mem, r in before["assignment"].items()}
    bound = lower_bound_moves(partitions, [Assignee(x) for x in [*current, *joiners]],
                              current, owner_before)
    t0 = time.monotonic()
    for i, pod in enumerate(joiners):
        m.join(pod)
        if i + 1 < len(joiners):
            time.sleep(max(0.0, t0 + (i + 1) * BURST_SPACING - time.monotonic()))
    spread = time.monotonic() - t0
    after = wait_until("stable after the burst", lambda: st.stable_with(members + len(joiners)),
                       timeout=300)
    owner_after = targets(after)
    moved = {p for p in owner_after if owner_after[p] != owner_before.get(p)}
    recs = audit(m)
    sessions = [r["mono"] for r in recs if r["member"] in joiners and r["event"] == "session"
                and r["mono"] >= t0 - 1]
    first = min(sessions)
    done = max((r["mono"] for r in recs if r["event"] == "acquire" and r["partition"] in moved
                and r["member"] == owner_after[r["partition"]] and r["mono"] >= first),
               default=first)
    epochs = int(after["epoch"]) - int(before["epoch"])
    # the burst leaves together (SIGTERM): time to every partition owned by the remaining
    t1 = time.monotonic()
    threads = [threading.Thread(target=m.leave, args=(pod,)) for pod in joiners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    back = wait_until("stable after the burst left", lambda: st.stable_with(members),
                      timeout=300)
    recs = audit(m)
    gone = {p for p in targets(back) if owner_after.get(p) in joiners}
    left = max((r["mono"] for r in recs if r["event"] == "acquire" and r["partition"] in gone
                and r["member"] not in joiners and r["mono"] >= t1), default=t1)
    return {"seconds": done - first, "joins_spread_s": spread,
            "sessions_spread_s": max(sessions) - first, "epochs": epochs,
            "moved": len(moved), "lower_bound": bound, "leave_seconds": left - t1,
            "leave_epochs": int(back["epoch"]) - int(after["epoch"])}


def run(*, partitions: int, members: int, rounds: int, crash_rounds: int, swarm: bool,
        settings: str = "window0", burst_rounds: int = 0, quiet_before: float = 0.0) -> Obj:
    st = Stage("bench-rebalance")
    m: Members | None = None
    try:
        pods = [f"w-{i}" for i in range(members + 1)]
        joiners = [f"b-{i}" for i in range(BURST)] if burst_rounds else []
        st.pods(pods + joiners)
        st.create_group(partitions=partitions, **SETTINGS[settings])
        stored = group_settings(st)
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
            if quiet_before > 0:  # nothing happens in the group for this long first
                time.sleep(quiet_before)
            if i < crash_rounds:
                crashes.append(depart_round(st, m, extra, members, crash=True))
            else:
                leaves.append(depart_round(st, m, extra, members, crash=False))
            print(f"  round {i + 1}: join {joins[-1]['seconds']:.2f} s "
                  f"(moved {joins[-1]['moved']}, bound {joins[-1]['lower_bound']}, "
                  f"unmoved pauses {joins[-1]['unmoved_pauses']})"
                  + (f", crash {crashes[-1]:.2f} s" if i < crash_rounds
                     else f", leave {leaves[-1]:.2f} s"), flush=True)
        bursts = []
        for i in range(burst_rounds):
            bursts.append(burst_round(st, m, joiners, members, partitions))
            print(f"  burst {i + 1}: {bursts[-1]}", flush=True)
        recs, ended = lives(audit(m), m.kills)
        violations = safety_violations(recs, ended_at=ended)
        for line in violations[:5]:
            print(f"  SAFETY: {line}", flush=True)
        js = [j["seconds"] for j in joins]
        bs = [b["seconds"] for b in bursts]
        return {
            "settings": settings, "group_spec": stored,
            "partitions": partitions, "members": f"{members}->{members + 1}",
            "mode": "swarm (one process)" if swarm else "one process per sidecar",
            "initial_stable_s": initial,
            "join_p50_s": pct(js, 0.5), "join_p95_s": pct(js, 0.95), "join_runs": len(js),
            "moved": sorted({j["moved"] for j in joins}),
            "lower_bound": sorted({j["lower_bound"] for j in joins}),
            "moved_minus_bound_max": max(j["moved"] - j["lower_bound"] for j in joins),
            "unmoved_pauses": sum(j["unmoved_pauses"] for j in joins),
            # Lease writes (all clients, cluster-wide) from the join to Stable; PATCH is
            # the operator's assignment marks only (sidecars write with PUT/POST/DELETE)
            "join_lease_writes_p50": {v: pct([j["lease_writes"].get(v, 0.0) for j in joins], 0.5)
                                      for v in ("POST", "PUT", "PATCH", "DELETE")},
            "join_acquires_p50": pct([j["acquires"] for j in joins], 0.5),
            "leave_p50_s": pct(leaves, 0.5), "leave_p95_s": pct(leaves, 0.95),
            "leave_runs": len(leaves),
            "crash_p50_s": pct(crashes, 0.5), "crash_p95_s": pct(crashes, 0.95),
            "crash_max_s": max(crashes, default=float("nan")),
            "crash_runs": len(crashes), "safety_violations": len(violations),
            "burst_p50_s": pct(bs, 0.5), "burst_p95_s": pct(bs, 0.95), "burst_runs": len(bs),
            "burst_epochs": [b["epochs"] for b in bursts],
            "burst_moved_minus_bound": [b["moved"] - b["lower_bound"] for b in bursts],
            "burst_leave_s": [b["leave_seconds"] for b in bursts],
            "burst_leave_epochs": [b["leave_epochs"] for b in bursts],
            "joins": js, "leaves": leaves, "crashes": crashes, "bursts": bursts,
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
    ap.add_argument("--burst-rounds", type=int, default=0,
                    help=f"bursts of {BURST} joins within 3 s (then {BURST} leaves)")
    ap.add_argument("--settings", default="window0",
                    help="comma-separated, each its own group: defaults, window0")
    ap.add_argument("--swarm", action="store_true", help="in-process swarm, not processes")
    ap.add_argument("--quiet-before", type=float, default=0.0,
                    help="seconds the group is left alone before each leave or crash (the "
                         "operator reads a group quiet for 10 s less often)")
    ap.add_argument("--out", type=Path, default=None, help="write every result here (JSON)")
    args = ap.parse_args()
    results: list[Obj] = []
    facts = machine()  # the load average at the start
    for settings in args.settings.split(","):
        print(f"[rebalance] settings {settings}", flush=True)
        result = run(partitions=args.partitions, members=args.members, rounds=args.rounds,
                     crash_rounds=args.crash_rounds, swarm=args.swarm, settings=settings,
                     burst_rounds=args.burst_rounds, quiet_before=args.quiet_before)
        results.append(result)
        print(json.dumps({k: v for k, v in result.items()
                          if k not in ("joins", "leaves", "crashes", "bursts")}, indent=1),
              flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(
                {"machine": facts, "command": " ".join(
                    ["bench/bench_rebalance.py", *sys.argv[1:]]), "runs": results},
                indent=1) + "\n")


if __name__ == "__main__":
    main()
