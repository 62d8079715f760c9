"""Scale: one group of many partitions and members (the swarm), the real operator.

Rule: timings live here, never in tests; prints and returns figures, asserts nothing.
Per size (partitions x members, default lease 15 s / renew 5 s, window 0): time from an
empty group to Stable (the operator creates every partition Lease, members take them), a
join and a leave at that size, the operator's CPU seconds (``/proc/<pid>/stat``), and
Lease writes per second while stable over ``--window`` seconds, two ways:

- ``ns_writes_per_s``: the members' own write counters (exactly this namespace's sidecar
  writes) — the figure that must track members, not partitions;
- ``apiserver_lease_writes_per_s``: the API server's ``apiserver_request_total`` for
  leases (PUT+POST+DELETE), cluster-wide: includes other engineers' tests and the control
  plane's own leader election, so it is an upper bound.

Also the Lease watch events the API server sent (``apiserver_watch_events_total``,
cluster-wide) from empty to Stable and per second while stable: with scoped partition
watches these grow with each member's share, not with members x partitions.

Members run in swarms (``kgroup_devcluster.swarm``), not as 200 processes: with
``--processes N`` (N > 1) in N swarm processes, members dealt out between them, each
sharing one watch among its own members; every swarm reports its loop's worst lag, CPU
seconds and fencings (``swarms``), so a size that falls short says which loop starved.
``--merge`` writes each size into ``docs/bench/results.json`` (section ``scale``,
replacing the same size, keeping the others) with its own command and machine facts.

    .venv/bin/python bench/bench_scale.py [--sizes 10000x200,1000x200,10000x50] [--window 30]
        [--processes 4] [--merge]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage import (
    Stage,
    apiserver_requests,
    apiserver_watch_events,
    cpu_seconds,
    machine,
    wait_until,
)

from kgroup.core.objects import Obj
from kgroup_devcluster.swarm import Swarm, SwarmProcs

WRITE_VERBS = ("PUT", "POST", "DELETE", "PATCH")


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        p, m = part.lower().split("x")
        out.append((int(p), int(m)))
    return out


def swarm_stats(swarm: Swarm | SwarmProcs) -> list[Obj]:
    try:
        return swarm.stats() if isinstance(swarm, SwarmProcs) else [swarm.stats()]
    except Exception as exc:  # a swarm process that died says so
        return [{"error": str(exc)[:200]}]


def one(partitions: int, members: int, *, window: float, timeout: float,
        processes: int = 1) -> Obj:
    st = Stage("bench-scale")
    swarm: Swarm | SwarmProcs | None = None
    result: Obj = {"partitions": partitions, "members": members, "swarm_processes": processes}
    try:
        pods = [f"w-{i}" for i in range(members + 1)]
        st.pods(pods)
        st.create_group(partitions=partitions, window=0)
        t0, watch0 = time.monotonic(), apiserver_watch_events(st.cluster)
        op = st.start_operator()
        kw: Obj = {"kubeconfig": str(st.cluster.kubeconfig), "namespace": st.ns,
                   "group": st.group}
        swarm = (SwarmProcs(processes=processes, **kw) if processes > 1 else Swarm(**kw)).start()
        swarm.add(pods[:members])
        wait_until("Stable", lambda: st.stable_with(members), timeout=timeout, interval=1.0)
        result["swarms_at_stable"] = swarm_stats(swarm)
        result["empty_to_stable_s"] = time.monotonic() - t0
        result["operator_cpu_s_to_stable"] = cpu_seconds(op.pid)
        result["fencings_to_stable"] = swarm.fencings()
        result["lease_watch_events_to_stable"] = apiserver_watch_events(st.cluster) - watch0
        print(f"  {partitions}x{members}: Stable after {result['empty_to_stable_s']:.1f} s",
              flush=True)

        t0 = time.monotonic()
        swarm.add(pods[members:])
        wait_until("Stable after join", lambda: st.stable_with(members + 1), timeout=timeout)
        result["join_to_stable_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        swarm.leave(pods[members])
        wait_until("Stable after leave", lambda: st.stable_with(members), timeout=timeout)
        result["leave_to_stable_s"] = time.monotonic() - t0
        result["moved_on_leave"] = (st.status().get("lastRebalance") or {}).get("moved")

        cpu0, writes0 = cpu_seconds(op.pid), swarm.api_writes()
        api0, t0 = apiserver_requests(st.cluster), time.monotonic()
        watch1 = apiserver_watch_events(st.cluster)
        epoch0 = st.status().get("epoch")
        time.sleep(window)  # a measuring window, not a wait for a condition
        elapsed = time.monotonic() - t0
        api1 = apiserver_requests(st.cluster)
        result["window_s"] = round(elapsed, 1)
        result["ns_writes_per_s"] = (swarm.api_writes() - writes0) / elapsed
        result["apiserver_lease_writes_per_s"] = sum(
            api1.get(v, 0) - api0.get(v, 0) for v in WRITE_VERBS) / elapsed
        result["lease_watch_events_per_s_stable"] = (
            apiserver_watch_events(st.cluster) - watch1) / elapsed
        result["operator_cpu_s_per_min_stable"] = (cpu_seconds(op.pid) - cpu0) * 60 / elapsed
        result["epoch_bumps_while_stable"] = int(st.status().get("epoch") or 0) - int(epoch0 or 0)
        result["swarms"] = swarm_stats(swarm)
        result["swarm_watch_events"] = sum(int(x.get("events", 0)) for x in result["swarms"])
        result["fencings_total"] = swarm.fencings()
    except (TimeoutError, RuntimeError) as exc:
        result["fell_short"] = f"timed out: {exc}"[:300]
        if swarm is not None:
            result["swarms"] = swarm_stats(swarm)
            with_status = st.status()
            result["status_at_timeout"] = {k: with_status.get(k) for k in (
                "phase", "memberCount", "unowned", "epoch")}
        print(f"  {partitions}x{members}: {result['fell_short']}", flush=True)
    finally:
        if swarm is not None:
            swarm.close()
        st.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000x200,1000x200,10000x50")
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--processes", type=int, default=1, help="swarm processes (members split)")
    ap.add_argument("--merge", action="store_true", help="write into docs/bench/results.json")
    args = ap.parse_args()
    out = []
    for p, m in parse_sizes(args.sizes):
        facts = machine()
        row = one(p, m, window=args.window, timeout=args.timeout, processes=args.processes)
        row["command"] = (f".venv/bin/python bench/bench_scale.py --sizes {p}x{m} "
                          f"--window {args.window:g} --timeout {args.timeout:g} "
                          f"--processes {args.processes}")
        row["load_average_at_start"] = facts["load_average"]
        out.append(row)
        print(json.dumps(row, indent=1), flush=True)
        if args.merge:
            merge(row)


def merge(row: Obj) -> None:
    path = Path(__file__).resolve().parents[1] / "docs" / "bench" / "results.json"
    results: Obj = json.loads(path.read_text()) if path.exists() else {}
    section = results.setdefault("scale", {"figures": {"sizes": []}})
    sizes = section.setdefault("figures", {}).setdefault("sizes", [])
    sizes[:] = [s for s in sizes if (s["partitions"], s["members"])
                != (row["partitions"], row["members"])] + [row]
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
