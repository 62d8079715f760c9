"""What a group costs, against its size: the API server's watch traffic and writes, the
operator's and the sidecars' CPU and memory, and how fast it settles.

Rule: timings live here, never in tests; prints and returns figures, asserts nothing.
One size at a time (members x partitions, the CRD's default settings: lease 8 s, renew
2 s, window and drain as defaulted), every app reporting health every second:

- empty -> Stable (the operator creates every partition Lease, members take them), then
  a join and a leave at that size (each until Stable again);
- over ``--window`` seconds of steady state after that: Lease watch events and bytes per
  second the API server *sent* (``apiserver_watch_events_total`` and
  ``apiserver_watch_events_sizes_sum`` for leases: counted per watcher), Lease writes per
  second (``apiserver_request_total`` for leases, verbs create/update/patch), the
  operator's cores and RSS (``/proc/<pid>``), its planning passes per second
  (``kgroup_planning_passes_total`` from its own ``/metrics``) and the members' cores and
  RSS. The API server's counters are cluster-wide, so a baseline measured over the same
  window before the size starts (nothing of ours running) is subtracted.

Members, two ways:

- ``swarm`` (default): the real sidecar code, many members per process
  (``kgroup_devcluster.swarm``). With ``--own-watches`` every member opens its own watches,
  so the API server sends what N pods would cost; without it the members of one process
  share one watch and the API server's figures show only the swarm's few watchers.
- ``--real N``: sizes up to N run N real ``kgroup-sidecar`` processes (each with its own
  watches, as N pods have) plus a tiny app per process (``GET /v1/assignment``, releases
  what is revoking, ``POST /v1/health`` every second); their cores and RSS are the
  sidecar figures.

At the end, each cost's exponent against members (least squares on log-log) and the
ratio of each size's cost to the previous. ``--out`` writes the JSON (default
``docs/bench/cost.json``).

    .venv/bin/python bench/bench_cost.py [--members 10,50,200] [--partitions 10000]
        [--window 60] [--own-watches] [--real 50] [--processes 2]
    .venv/bin/python bench/bench_cost.py --groups 100 --members 10 --partitions 100
        # 100 groups x 10 members (own watches) on one operator
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_sidecars import RealSidecars
from stage import CLK_TCK, Stage, cpu_seconds, machine, wait_until

from kgroup.core.objects import Obj
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.swarm import Swarm, SwarmProcs

REPO = Path(__file__).resolve().parents[1]
WRITE_VERBS = ("create", "update", "patch", "post", "put")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# ---- measuring --------------------------------------------------------------------------


def api_lease_counters(cl: Cluster) -> dict[str, float]:
    """The API server's lease counters now: watch events and bytes sent (to every watcher),
    and lease writes."""
    out = {"watch_events": 0.0, "watch_bytes": 0.0, "writes": 0.0}
    for line in cl.apiserver_metrics().splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m["name"]
        if name not in ("apiserver_watch_events_total", "apiserver_watch_events_sizes_sum",
                        "apiserver_request_total"):
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        lease = (labels.get("resource") == "leases"
                 or (labels.get("kind") == "Lease"
                     and labels.get("group") == "coordination.k8s.io"))
        if not lease:
            continue
        value = float(m["value"])
        if name == "apiserver_watch_events_total":
            out["watch_events"] += value
        elif name == "apiserver_watch_events_sizes_sum":
            out["watch_bytes"] += value
        elif labels.get("verb", "").lower() in WRITE_VERBS:
            out["writes"] += value
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def own_cpu_seconds(pid: int) -> float:
    """utime + stime of a process alone (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return float(int(fields[11]) + int(fields[12])) / float(CLK_TCK)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def operator_metric(port: int, name: str) -> float | None:
    """A family's sum on the operator's own ``/metrics``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


class Window:
    """Counters read at the start and the end of a measuring window."""

    def __init__(self, st: Stage, op_pid: int, op_port: int, member_pids: list[int]) -> None:
        self.st, self.op_pid, self.op_port = st, op_pid, op_port
        self.member_pids = member_pids

    def read(self) -> Obj:
        return {
            "t": time.monotonic(),
            "api": api_lease_counters(self.st.cluster),
            "op_cpu": own_cpu_seconds(self.op_pid),
            "members_cpu": {p: own_cpu_seconds(p) for p in self.member_pids},
            "passes": operator_metric(self.op_port, "kgroup_planning_passes_total"),
        }

    def rates(self, a: Obj, b: Obj) -> Obj:
        dt = b["t"] - a["t"]
        api = {k: (b["api"][k] - a["api"][k]) / dt for k in a["api"]}
        members = [(b["members_cpu"][p] - a["members_cpu"][p]) / dt for p in self.member_pids]
        out = {
            "window_s": round(dt, 1),
            "lease_watch_events_per_s": api["watch_events"],
            "lease_watch_kib_per_s": api["watch_bytes"] / 1024,
            "lease_writes_per_s": api["writes"],
            "operator_cores": (b["op_cpu"] - a["op_cpu"]) / dt,
            "operator_rss_mb": rss_mb(self.op_pid),
            "member_process_cores_total": sum(members),
        }
        if a["passes"] is not None and b["passes"] is not None:
            out["planning_passes_per_s"] = (b["passes"] - a["passes"]) / dt
        return out


# ---- real sidecars ----------------------------------------------------------------------


class Timeline:
    """Where empty -> Stable goes: every ``interval`` s one list of the group's partition
    Leases (raw JSON), counting the locks that exist, carry an assignment mark and have a
    holder; the first moment each count reached the partition count."""

    def __init__(self, st: Stage, partitions: int, interval: float = 5.0) -> None:
        self.st, self.partitions, self.interval = st, partitions, interval
        self.t0 = time.monotonic()
        self.samples: list[tuple[float, int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline", daemon=True)
        self._thread.start()

    def _count(self) -> tuple[int, int, int]:
        raw = self.st.coord.list_namespaced_lease(
            self.st.ns,
            label_selector=f"kgroup.dev/group={self.st.group},kgroup.dev/role=partition",
            _preload_content=False)
        items = json.loads(raw.data)["items"]
        marked = sum(1 for o in items
                     if (o["metadata"].get("annotations") or {}).get("kgroup.dev/assigned"))
        held = sum(1 for o in items if (o.get("spec") or {}).get("holderIdentity"))
        return len(items), marked, held

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.samples.append((round(time.monotonic() - self.t0, 1), *self._count()))

    def stop(self) -> Obj:
        self._stop.set()
        self._thread.join(30)
        first: Obj = {}
        for name, i in (("all_locks_created_s", 1), ("all_locks_marked_s", 2),
                        ("all_locks_held_s", 3)):
            first[name] = next((s[0] for s in self.samples if s[i] >= self.partitions), None)
        return {**first, "samples": self.samples}


def baseline(st: Stage, seconds: float) -> Obj:
    """The API server's lease counters per second with nothing of ours running: once no
    namespace is being deleted (an earlier size's 10,000 Leases going away sent ≈ 200
    watch events/s into a baseline and made the subtraction negative)."""
    def quiet() -> bool:  # wait_until: any truthy answer ends the wait
        return not any(n.status.phase == "Terminating" for n in st.core.list_namespace().items)

    wait_until("no namespace terminating", quiet, timeout=600, interval=2.0)
    a, t0 = api_lease_counters(st.cluster), time.monotonic()
    time.sleep(seconds)
    b, dt = api_lease_counters(st.cluster), time.monotonic() - t0
    return {k: (b[k] - a[k]) / dt for k in a}


LEASE: tuple[int | None, int | None] = (None, None)
"""(duration, renew) of every group made; None: the CRD's default (``--lease``)."""


def one(members: int, partitions: int, *, window: float, timeout: float, real: bool,
        own_watches: bool, processes: int, base_port: int,
        operator_from: Path | None = None, profile_dir: Path | None = None) -> Obj:
    st = Stage("bench-cost")
    result: Obj = {"members": members, "partitions": partitions,
                   "how": "real sidecar processes" if real else (
                       "swarm, own watches per member" if own_watches
                       else "swarm, watches shared per process"),
                   "swarm_processes": 0 if real else processes,
                   "lease_duration_renew": LEASE}
    swarm: Swarm | SwarmProcs | None = None
    sidecars: RealSidecars | None = None
    timeline: Timeline | None = None
    try:
        pods = [f"w-{i}" for i in range(members + 1)]
        st.pods(pods)
        base = baseline(st, min(15.0, window))
        result["baseline_per_s"] = base
        st.create_group(partitions=partitions, window=None, duration=LEASE[0],
                        renew=LEASE[1], drain=None)
        t0 = time.monotonic()
        timeline = Timeline(st, partitions)
        op_port = free_port()
        op = st.start_operator(metrics_port=op_port, env=(
            {"PYTHONPATH": f"{operator_from}:{operator_from}/operator"} if operator_from
            else None))
        if real:
            sidecars = RealSidecars(st, pods[:members], base_port)
        else:
            kw: Obj = {"kubeconfig": str(st.cluster.kubeconfig), "namespace": st.ns,
                       "group": st.group, "own_watches": own_watches, "health_interval": 1.0}
            swarm = (SwarmProcs(processes=processes, **kw) if processes > 1
                     else Swarm(**kw)).start()
            swarm.add(pods[:members])
        wait_until("Stable", lambda: st.stable_with(members), timeout=timeout, interval=1.0)
        result["empty_to_stable_s"] = round(time.monotonic() - t0, 1)
        result["timeline"] = timeline.stop()
        print(f"  {members}x{partitions}: Stable after {result['empty_to_stable_s']} s",
              flush=True)
        t0 = time.monotonic()
        if sidecars is not None:
            sidecars.add(pods[members:])
        else:
            assert swarm is not None
            swarm.add(pods[members:])
        wait_until("Stable after join", lambda: st.stable_with(members + 1), timeout=timeout)
        result["join_to_stable_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        if sidecars is not None:
            sidecars.leave(pods[members])
        else:
            assert swarm is not None
            swarm.leave(pods[members])
        wait_until("Stable after leave", lambda: st.stable_with(members), timeout=timeout)
        result["leave_to_stable_s"] = round(time.monotonic() - t0, 1)

        member_pids = sidecars.pids() if sidecars is not None else (
            [int(s["pid"]) for s in swarm.stats()] if isinstance(swarm, SwarmProcs)
            else [os.getpid()])
        w = Window(st, op.pid, op_port, member_pids)
        epoch0 = st.status().get("epoch")
        spy = None
        if profile_dir is not None:  # py-spy samples the operator over the window
            profile_dir.mkdir(parents=True, exist_ok=True)
            out = profile_dir / f"operator-{members}x{partitions}.folded"
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(op.pid),
                 "--duration", str(int(window)), "--rate", "50", "--format", "raw",
                 "--nonblocking", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            result["profile"] = str(out)
        def deliveries() -> int:
            if swarm is None:
                return 0
            stats = swarm.stats() if isinstance(swarm, SwarmProcs) else [swarm.stats()]
            return sum(int(x.get("deliveries", 0)) for x in stats)

        d0 = deliveries()
        a = w.read()
        time.sleep(window)  # the measuring window, not a wait for a condition
        b = w.read()
        if swarm is not None and not own_watches:
            # what N pods' own watches would be sent: the hub hands each event to every
            # member whose watch would show it (``Hub.flush``)
            result["member_watch_deliveries_per_s"] = (deliveries() - d0) / (b["t"] - a["t"])
        if spy is not None:
            spy.wait(60)
        rates = w.rates(a, b)
        for k, key in (("watch_events", "lease_watch_events_per_s"),
                       ("watch_bytes", "lease_watch_kib_per_s"),
                       ("writes", "lease_writes_per_s")):
            raw = rates[key]
            rates[key + "_raw"] = raw
            rates[key] = raw - base[k] / (1024 if k == "watch_bytes" else 1)
        result.update(rates)
        result["epoch_bumps_while_stable"] = int(st.status().get("epoch") or 0) - int(epoch0 or 0)
        result["operator_cpu_s_total"] = cpu_seconds(op.pid)
        if sidecars is not None:
            n = len(member_pids)
            result["sidecar_mcpu_each"] = 1000 * rates["member_process_cores_total"] / n
            result["sidecar_rss_mb_each"] = sum(rss_mb(p) for p in member_pids) / n
            result["app_errors"] = sidecars.errors
        elif swarm is not None:
            result["swarms"] = swarm.stats() if isinstance(swarm, SwarmProcs) else [swarm.stats()]
            result["swarm_rss_mb"] = sum(rss_mb(p) for p in member_pids)
            result["fencings"] = swarm.fencings()
    except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as exc:
        result["fell_short"] = f"{type(exc).__name__}: {exc}"[:300]
        if timeline is not None and "timeline" not in result:
            result["timeline"] = timeline.stop()
        with contextlib.suppress(Exception):
            status = st.status()
            result["status_at_timeout"] = {k: status.get(k) for k in (
                "phase", "memberCount", "unowned", "epoch")}
        print(f"  {members}x{partitions}: {result['fell_short']}", flush=True)
    finally:
        if swarm is not None:
            swarm.close()
        if sidecars is not None:
            sidecars.close()
        st.close()
    return result


def many(groups: int, members: int, partitions: int, *, window: float, timeout: float,
         processes: int, operator_from: Path | None = None) -> Obj:
    """``groups`` groups of ``members`` swarm members each (own watches), one operator:
    empty -> every group Stable, then the steady-state window (no join or leave)."""
    st = Stage("bench-groups")
    result: Obj = {"groups": groups, "members": groups * members,
                   "members_per_group": members, "partitions": partitions,
                   "how": "swarm, own watches per member", "swarm_processes": processes,
                   "lease_duration_renew": LEASE}
    swarm: SwarmProcs | None = None
    names = [f"g{i}" for i in range(groups)]
    try:
        st.room_for(groups * members + 50)
        for g in names:
            st.pods([f"{g}-w-{j}" for j in range(members)], app=g)
        result["baseline_per_s"] = base = baseline(st, min(15.0, window))
        for g in names:
            st.create_group(partitions=partitions, window=None, duration=LEASE[0],
                            renew=LEASE[1], drain=None, name=g)
        t0 = time.monotonic()
        op_port = free_port()
        op = st.start_operator(metrics_port=op_port, env=(
            {"PYTHONPATH": f"{operator_from}:{operator_from}/operator"} if operator_from
            else None))
        swarm = SwarmProcs(kubeconfig=str(st.cluster.kubeconfig), namespace=st.ns,
                           group=names[0], processes=processes, own_watches=True,
                           health_interval=1.0)
        for g in names:
            swarm.add([f"{g}-w-{j}" for j in range(members)], group=g)

        def all_stable() -> bool:
            # wait_until ends on any truthy answer: this returned "k of N Stable" (a
            # truthy string) until 2026-11-26, so the wait ended at its first look
            listing = st.custom.list_namespaced_custom_object(
                "kgroup.dev", "v1alpha1", st.ns, "consumergroups")
            stable = sum(1 for o in listing["items"]
                         if st.stable_with(members, dict(o.get("status") or {})))
            result["groups_stable_last_seen"] = stable
            return stable == groups

        wait_until("every group Stable", all_stable, timeout=timeout, interval=2.0)
        result["empty_to_stable_s"] = round(time.monotonic() - t0, 1)
        print(f"  {groups} groups x {members}: all Stable after "
              f"{result['empty_to_stable_s']} s", flush=True)
        member_pids = [int(x["pid"]) for x in swarm.stats()]
        w = Window(st, op.pid, op_port, member_pids)
        a = w.read()
        time.sleep(window)  # the measuring window, not a wait for a condition
        b = w.read()
        rates = w.rates(a, b)
        for k, key in (("watch_events", "lease_watch_events_per_s"),
                       ("watch_bytes", "lease_watch_kib_per_s"),
                       ("writes", "lease_writes_per_s")):
            rates[key + "_raw"] = rates[key]
            rates[key] = rates[key] - base[k] / (1024 if k == "watch_bytes" else 1)
        result.update(rates)
        result["operator_cpu_s_total"] = cpu_seconds(op.pid)
        print(json.dumps(result, default=str), flush=True)  # the window's figures first
        result["swarms"] = swarm.stats()
        result["swarm_rss_mb"] = sum(rss_mb(p) for p in member_pids)
        result["fencings"] = swarm.fencings()
        # before the teardown: crashing 1,000 swarm members one by one takes minutes
        print(json.dumps(result, default=str), flush=True)
    except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as exc:
        result["fell_short"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"  {groups} groups: {result['fell_short']}", flush=True)
    finally:
        if swarm is not None:
            swarm.close()
        st.close()
    return result


# ---- fits and the table -----------------------------------------------------------------

COSTS = ("lease_watch_events_per_s", "lease_watch_kib_per_s", "lease_writes_per_s",
         "operator_cores", "planning_passes_per_s", "sidecar_mcpu_each")


def exponent(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(cost) against log(members); None with < 2 usable points."""
    pts = [(math.log(m), math.log(c)) for m, c in points if m > 0 and c > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def fits(rows: list[Obj]) -> Obj:
    ok = sorted((r for r in rows if "fell_short" not in r), key=lambda r: r["members"])
    out: Obj = {}
    for cost in COSTS:
        points = [(float(r["members"]), float(r[cost])) for r in ok if r.get(cost) is not None]
        if len(points) < 2:
            continue
        b = exponent(points)
        steps = list(itertools.pairwise(points))
        out[cost] = {"exponent": None if b is None else round(b, 2),
                     "ratios": [round(c1 / c0, 2) if c0 > 0 else None
                                for (_, c0), (_, c1) in steps],
                     "member_ratios": [round(m1 / m0, 2) for (m0, _), (m1, _) in steps]}
    return out


def table(rows: list[Obj]) -> str:
    head = ("| members | watch events/s | watch KiB/s | Lease writes/s | operator cores "
            "| operator RSS MB | passes/s | sidecar mCPU / RSS MB | empty->Stable s "
            "| join s | leave s |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        if "fell_short" in r:
            lines.append(f"| {r['members']} | {r['fell_short']} |" + " |" * 9)
            continue
        side = (f"{r['sidecar_mcpu_each']:.1f} / {r['sidecar_rss_mb_each']:.0f}"
                if "sidecar_mcpu_each" in r else "(swarm)")
        passes = r.get("planning_passes_per_s")
        lines.append(
            f"| {r['members']} | {r['lease_watch_events_per_s']:.1f} "
            f"| {r['lease_watch_kib_per_s']:.1f} | {r['lease_writes_per_s']:.1f} "
            f"| {r['operator_cores']:.4f} | {r['operator_rss_mb']:.0f} "
            f"| {'-' if passes is None else f'{passes:.2f}'} | {side} "
            f"| {r['empty_to_stable_s']} | {r['join_to_stable_s']} "
            f"| {r['leave_to_stable_s']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", default="10,50,200", help="sizes, comma-separated")
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--window", type=float, default=60.0, help="steady-state seconds measured")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--real", type=int, default=0,
                    help="sizes up to this many members run real kgroup-sidecar processes")
    ap.add_argument("--own-watches", action="store_true",
                    help="swarm members open their own watches (what N pods cost)")
    ap.add_argument("--processes", type=int, default=2, help="swarm processes")
    ap.add_argument("--base-port", type=int, default=18600,
                    help="real sidecars listen on 127.0.0.1 from this port up")
    ap.add_argument("--operator-from", type=Path, default=None,
                    help="run the operator from this checkout's code (a before/after)")
    ap.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                    help="sample the operator with py-spy over the window (needs py-spy in "
                         "the venv); folded stacks go to DIR")
    ap.add_argument("--groups", type=int, default=0,
                    help="instead of sizes: this many groups of --members members each "
                         "(own watches) on one operator")
    ap.add_argument("--lease", default="", metavar="DURATION/RENEW",
                    help="lease duration and renew interval (seconds) instead of the CRD's "
                         "defaults (8/2): longer ones give requests more time on a loaded "
                         "machine (the request timeout is derived from them)")
    ap.add_argument("--label", default="", help="a name for this run in the JSON")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "cost.json")
    args = ap.parse_args()
    sizes = [int(x) for x in args.members.split(",") if x]
    global LEASE
    if args.lease:
        duration, renew = (int(x) for x in args.lease.split("/"))
        LEASE = (duration, renew)
    command = ".venv/bin/python bench/bench_cost.py " + " ".join(sys.argv[1:])
    rows = []
    if args.groups:
        facts = machine()
        row = many(args.groups, sizes[0], args.partitions, window=args.window,
                   timeout=args.timeout, processes=args.processes,
                   operator_from=args.operator_from)
        row["load_average_at_start"] = facts["load_average"]
        row["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(row, default=str), flush=True)
        runs0: Obj = json.loads(args.out.read_text()) if args.out.exists() else {}
        runs0[args.label or command] = {"command": command, "machine": machine(),
                                        "groups": row, "when": time.strftime(
                                            "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        args.out.write_text(json.dumps(runs0, indent=1, default=str) + "\n")
        return
    for m in sizes:
        facts = machine()
        row = one(m, args.partitions, window=args.window, timeout=args.timeout,
                  real=m <= args.real, own_watches=args.own_watches,
                  processes=args.processes, base_port=args.base_port,
                  operator_from=args.operator_from, profile_dir=args.py_spy)
        row["load_average_at_start"] = facts["load_average"]
        row["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    fitted = fits(rows)
    print(table(rows))
    for cost, f in fitted.items():
        print(f"  {cost}: exponent {f['exponent']} (ratios {f['ratios']} "
              f"for members x{f['member_ratios']})")
    runs: Obj = json.loads(args.out.read_text()) if args.out.exists() else {}
    key = args.label or command
    runs[key] = {"command": command, "machine": machine(), "sizes": rows, "fits": fitted,
                 "table": table(rows), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                             time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=1, default=str) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
