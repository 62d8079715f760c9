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

Members run in the in-process swarm (``kgroup_devcluster.swarm``), not as 200 processes.

    .venv/bin/python bench/bench_scale.py [--sizes 10000x200,1000x200,10000x50] [--window 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage import Stage, apiserver_requests, cpu_seconds, wait_until

from kgroup_devcluster.swarm import Swarm

Obj = dict[str, Any]
WRITE_VERBS = ("PUT", "POST", "DELETE", "PATCH")


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        p, m = part.lower().split("x")
        out.append((int(p), int(m)))
    return out


def one(partitions: int, members: int, *, window: float, timeout: float) -> Obj:
    st = Stage("bench-scale")
    swarm: Swarm | None = None
    result: Obj = {"partitions": partitions, "members": members}
    try:
        pods = [f"w-{i}" for i in range(members + 1)]
        st.pods(pods)
        st.create_group(partitions=partitions, window=0)
        t0 = time.monotonic()
        op = st.start_operator()
        swarm = Swarm(kubeconfig=str(st.cluster.kubeconfig), namespace=st.ns,
                      group=st.group).start()
        swarm.add(pods[:members])
        wait_until("Stable", lambda: st.stable_with(members), timeout=timeout, interval=1.0)
        result["empty_to_stable_s"] = time.monotonic() - t0
        result["operator_cpu_s_to_stable"] = cpu_seconds(op.pid)
        result["fencings_to_stable"] = swarm.fencings()
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
        epoch0 = st.status().get("epoch")
        time.sleep(window)  # a measuring window, not a wait for a condition
        elapsed = time.monotonic() - t0
        api1 = apiserver_requests(st.cluster)
        result["window_s"] = round(elapsed, 1)
        result["ns_writes_per_s"] = (swarm.api_writes() - writes0) / elapsed
        result["apiserver_lease_writes_per_s"] = sum(
            api1.get(v, 0) - api0.get(v, 0) for v in WRITE_VERBS) / elapsed
        result["operator_cpu_s_per_min_stable"] = (cpu_seconds(op.pid) - cpu0) * 60 / elapsed
        result["epoch_bumps_while_stable"] = int(st.status().get("epoch") or 0) - int(epoch0 or 0)
        result["swarm_watch_events"] = swarm.hub.events
        result["fencings_total"] = swarm.fencings()
    except TimeoutError as exc:
        result["fell_short"] = f"timed out: {exc}"[:300]
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
    args = ap.parse_args()
    out = [one(p, m, window=args.window, timeout=args.timeout)
           for p, m in parse_sizes(args.sizes)]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
