"""Lease watch fan-out in steady state: what the API server sends for one stable group.

Rule: figures only, no assertion. For each size N: N kwok pods, a group at the CRD's
default settings (64 partitions), the real operator, N real ``kgroup-sidecar`` processes
(each with its own watches, as N pods have, and an app that acknowledges revocations);
once Stable, kube-apiserver's ``apiserver_watch_events_total{resource="leases"}`` (one
count per event per watcher), ``apiserver_watch_events_sizes_sum`` and the Lease writes
(``apiserver_request_total``, PUT + PATCH) are read before and after ``--seconds`` of
steady state. The apps report no health (the renewals carry none): the fuller cost
benchmark is another's.

    .venv/bin/python bench/bench_lease_fanout.py --members 4,8,16 [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rebalance import Procs
from stage import Stage, apiserver_requests, apiserver_watch_events, wait_until

_SIZES = re.compile(r'^apiserver_watch_events_sizes_sum\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def watch_bytes(st: Stage) -> float:
    return sum(float(m["value"]) for line in st.cluster.apiserver_metrics().splitlines()
               if (m := _SIZES.match(line)) and 'resource="leases"' in m["labels"])


def lease_writes(st: Stage) -> float:
    verbs = apiserver_requests(st.cluster)
    return float(verbs.get("PUT", 0.0) + verbs.get("PATCH", 0.0))


def one(members: int, seconds: float) -> dict[str, float]:
    st = Stage("fanout")
    procs = Procs(st)
    try:
        pods = [f"w-{i}" for i in range(members)]
        st.pods(pods)
        st.create_group(partitions=64, window=None, duration=None, renew=None, drain=None)
        st.start_operator()
        for pod in pods:
            procs.join(pod)
        wait_until(f"Stable with {members}", lambda: st.stable_with(members), timeout=300)
        time.sleep(5)
        e0, b0, w0, t0 = apiserver_watch_events(st.cluster), watch_bytes(st), \
            lease_writes(st), time.monotonic()
        time.sleep(seconds)
        e1, b1, w1, t1 = apiserver_watch_events(st.cluster), watch_bytes(st), \
            lease_writes(st), time.monotonic()
        dt = t1 - t0
        return {"members": members, "events_per_s": (e1 - e0) / dt,
                "kib_per_s": (b1 - b0) / dt / 1024, "writes_per_s": (w1 - w0) / dt,
                "load1": os.getloadavg()[0]}
    finally:
        procs.close()
        st.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", default="4,8,16")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    print("| members | Lease watch events/s sent | watch KiB/s sent | Lease writes/s | load |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.members.split(",")):
        r = one(n, args.seconds)
        print(f"| {n} | {r['events_per_s']:.1f} | {r['kib_per_s']:.1f} | "
              f"{r['writes_per_s']:.1f} | {r['load1']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
