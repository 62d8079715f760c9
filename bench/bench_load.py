"""Load-aware assignment and autoscaling on the local control plane, with real sidecars.

The real operator and eight real ``kgroup-sidecar`` processes (``real_sidecars.py``)
share 64 partitions whose input rates follow Zipf (s = 0.8, total 640 events/s). The
apps are a model, not a stream: no event flows, so nothing can be lost or duplicated
here and the JSON says so (``lost``/``duplicated``: null). Each second the bench reads
who holds each lock, adds each partition's input to its backlog, and lets every member
work off at most its capacity (``--capacity``, default 3.5 x the mean member's input at
8 members) from the backlogs of the partitions it holds; each app reports to its sidecar the rate it
processed (smoothed, 10 s) and the backlog, as a real app would. So a member with too
much load really falls behind, and the operator sees what it would see.

Phases, one group (figures side by side):

1. count-based assignment (the default), settled, then +-20 % noise on every partition's
   input re-drawn every 20 s: busiest / mean, moves;
2. ``spec.balance.mode: load``: moves to settle, busiest / mean; then the same noise:
   moves;
3. the hot set shifted (the rates permuted): moves, busiest / mean;
4. ``spec.autoscaling`` (1..32 members, a real Deployment as the target, scale-down delay
   60 s with ``--quick``): the input x3, then back. The bench plays the Deployment's
   part: it starts a pod and a sidecar for each replica the operator sets, and stops
   the newest when it lowers them. Recommended members and replicas over time, the
   number of scale changes; beside them what KEDA's lag rule (replicas = ceil(total lag
   / lagThreshold), at most the partitions) recommends from the same lag series.

Busiest / mean is computed from the model's true inputs (noise off) over the lock
holders read from the API server, not from the reports. Moves are the partitions whose
target owner changed (the operator's RebalanceStarted Events).

    .venv/bin/python bench/bench_load.py --quick     # about 14 minutes
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_sidecars import RealSidecars
from stage import Stage, machine, wait_until

from kgroup import constants as C
from kgroup.core.operator.assignors import Assignee
from kgroup.core.operator.load_balance import load_bound

PARTITIONS = 64
MEMBERS = 8
ZIPF_S = 0.8
BASE_TOTAL = 640.0
CAPACITY_RATIO = 3.5
"""A member processes at most this many times the mean member's input at 8 members
(``--capacity``): 3.5 lets one member keep up with the hottest partition at three times
the input (Zipf 0.8 over 64: the hottest is 14 % of the total, 1.13 x the mean member's
share at 8 members, 3.4 x it at three times the input)."""
NOISE = 0.2
NOISE_EVERY = 20.0
SMOOTHING = 10.0  # seconds: the apps' rate is an exponentially weighted mean
MAX_MEMBERS = 32
KEDA_THRESHOLDS = (10, 1000)  # KEDA's Kafka scaler default lagThreshold; one tuned here
SCALE_TARGET = "bench-workers"
# seconds of each phase: --quick, and the full run
DURATIONS = {
    True: {"count_settle": 20, "count_noise": 60, "load_settle": 90, "load_noise": 60,
           "shift": 90, "auto_before": 120, "auto_up": 150, "auto_down": 180,
           "scale_down_delay": 60},
    False: {"count_settle": 40, "count_noise": 120, "load_settle": 180, "load_noise": 180,
            "shift": 180, "auto_before": 420, "auto_up": 300, "auto_down": 600,
            "scale_down_delay": 300},
}


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports on 127.0.0.1, below the ephemeral
    range (a port an outgoing connection took would refuse a sidecar's bind)."""
    rng = random.Random()
    for _ in range(200):
        base = 20_000 + rng.randint(0, 250) * 48
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports")


class Workload:
    """Every partition's input, backlog and processed rate; who holds it comes from the
    lock holders (one listing a second)."""

    def __init__(self, rng: random.Random, capacity: float) -> None:
        self.capacity = capacity
        weights = [1.0 / rank ** ZIPF_S for rank in range(1, PARTITIONS + 1)]
        rng.shuffle(weights)
        total = sum(weights)
        self.rng = rng
        self.base = [BASE_TOTAL * w / total for w in weights]
        self.noise = [1.0] * PARTITIONS
        self.factor = 1.0
        self.noisy = False
        self.lag = [0.0] * PARTITIONS
        self.rate = [0.0] * PARTITIONS
        self.holders: dict[int, str | None] = {}
        self.lock = threading.Lock()

    def input(self, p: int) -> float:
        return float(self.base[p] * self.factor * self.noise[p])

    def redraw(self) -> None:
        with self.lock:
            self.noise = [self.rng.uniform(1 - NOISE, 1 + NOISE) if self.noisy else 1.0
                          for _ in range(PARTITIONS)]

    def shift(self) -> None:
        with self.lock:
            self.rng.shuffle(self.base)

    def step(self, holders: dict[int, str | None], dt: float) -> None:
        with self.lock:
            self.holders = holders
            backlog: dict[str, float] = {}
            for p in range(PARTITIONS):
                self.lag[p] += self.input(p) * dt
                h = holders.get(p)
                if h:
                    backlog[h] = backlog.get(h, 0.0) + self.lag[p]
            alpha = 1 - math.exp(-dt / SMOOTHING)
            for p in range(PARTITIONS):
                h = holders.get(p)
                done = 0.0
                if h:
                    budget = self.capacity * dt
                    share = 1.0 if backlog[h] <= budget else budget / backlog[h]
                    done = self.lag[p] * share
                    self.lag[p] -= done
                self.rate[p] += alpha * (done / dt - self.rate[p])

    def figures(self, _pod: str, p: int) -> tuple[float, int]:
        with self.lock:
            return round(self.rate[p], 3), int(self.lag[p])

    def total_lag(self) -> int:
        with self.lock:
            return int(sum(self.lag))

    def busiest_over_mean(self) -> float:
        """The busiest member's true input (noise off) over the mean member's."""
        with self.lock:
            per: dict[str, float] = {}
            for p, h in self.holders.items():
                if h:
                    per[h] = per.get(h, 0.0) + self.base[p]
            if not per:
                return float("nan")
            return float(round(max(per.values()) / (sum(self.base) / len(per)), 3))


class Bench:
    def __init__(self, quick: bool, seed: int, capacity: float) -> None:
        self.quick = quick
        self.st = Stage("bench-load")
        self.work = Workload(random.Random(seed), capacity)
        self.stop = threading.Event()
        self.pods: list[str] = []
        self.sidecars: RealSidecars | None = None
        self.series: list[dict[str, Any]] = []
        self.threads: list[threading.Thread] = []

    # -- the world -----------------------------------------------------------------------

    def start(self) -> None:
        st = self.st
        st.room_for(MAX_MEMBERS + 8)
        st.create_group(partitions=PARTITIONS, window=2, duration=8, renew=2, drain=10)
        self.pods = [f"w-{i}" for i in range(MEMBERS)]
        st.pods(self.pods)
        st.start_operator()
        self.sidecars = RealSidecars(st, list(self.pods), base_port=free_ports(MAX_MEMBERS + 8),
                                     figures=self.work.figures)
        for target in (self._model, self._noise, self._sample):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)

    def _model(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(1.0):
            try:
                holders = self.st.holders()
            except Exception:
                continue
            now = time.monotonic()
            self.work.step(holders, now - last)
            last = now

    def _noise(self) -> None:
        while not self.stop.wait(NOISE_EVERY):
            self.work.redraw()

    def _sample(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(5.0):
            try:
                st = self.st.status()
            except client.ApiException:
                continue
            load = st.get("load") or {}
            auto = st.get("autoscaling") or {}
            self.series.append({"t": round(time.monotonic() - t0), "lag": self.work.total_lag(),
                                "recommended": load.get("recommendedMembers"),
                                "replicas": auto.get("replicas"),
                                "members": st.get("memberCount"),
                                "factor": self.work.factor})

    def close(self) -> None:
        self.stop.set()
        if self.sidecars is not None:
            self.sidecars.close()
        self.st.close()

    # -- what the operator did -------------------------------------------------------------

    def epoch(self) -> int:
        return int(self.st.status().get("epoch", 0))

    def moves_after(self, epoch: int) -> int:
        """Partitions moved by the rebalances after ``epoch`` (RebalanceStarted Events)."""
        events: Any = self.st.core.list_namespaced_event(self.st.ns)
        moved: dict[int, int] = {}
        for e in events.items:
            if e.reason != "RebalanceStarted":
                continue
            m = re.match(r"epoch (\d+): .*\((\d+) partitions move\)", e.message or "")
            if m and int(m.group(1)) > epoch:
                moved[int(m.group(1))] = int(m.group(2))
        return sum(moved.values())

    def scale_events(self) -> int:
        events: Any = self.st.core.list_namespaced_event(self.st.ns)
        return sum(1 for e in events.items if e.reason == "Scaled")

    def wait_stable(self, members: int, timeout: float = 180.0) -> None:
        wait_until(f"Stable with {members}", lambda: self.st.stable_with(members),
                   timeout=timeout, interval=1.0)

    def patch(self, spec: dict[str, Any]) -> None:
        self.st.custom.patch_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, self.st.ns, C.PLURAL, self.st.group, {"spec": spec})

    def hold(self, phase: str) -> None:
        time.sleep(DURATIONS[self.quick][phase])

    # -- phases --------------------------------------------------------------------------

    def count_phase(self) -> dict[str, Any]:
        self.wait_stable(MEMBERS)
        wait_until("status.load", lambda: self.st.status().get("load"), timeout=90)
        e0 = self.epoch()
        self.hold("count_settle")
        settle = self.moves_after(e0)
        ratio = self.work.busiest_over_mean()
        e1 = self.epoch()
        self.work.noisy = True
        self.work.redraw()
        self.hold("count_noise")
        self.work.noisy = False
        self.work.redraw()
        return {"busiest_over_mean": ratio, "moves_to_settle": settle,
                "moves_steady_noisy": self.moves_after(e1)}

    def load_phase(self) -> dict[str, Any]:
        e0 = self.epoch()
        self.patch({"balance": {"mode": "load"}})
        self.hold("load_settle")
        settle = self.moves_after(e0)
        ratio = self.work.busiest_over_mean()
        e1 = self.epoch()
        self.work.noisy = True
        self.work.redraw()
        self.hold("load_noise")
        self.work.noisy = False
        self.work.redraw()
        return {"busiest_over_mean": ratio, "moves_to_settle": settle,
                "moves_steady_noisy": self.moves_after(e1)}

    def shift_phase(self) -> dict[str, Any]:
        e0 = self.epoch()
        self.work.shift()
        self.hold("shift")
        return {"moves": self.moves_after(e0), "busiest_over_mean":
                self.work.busiest_over_mean()}

    def autoscale_phase(self) -> dict[str, Any]:
        st = self.st
        labels = {"app": SCALE_TARGET}
        client.AppsV1Api(st.api).create_namespaced_deployment(st.ns, client.V1Deployment(
            metadata=client.V1ObjectMeta(name=SCALE_TARGET),
            spec=client.V1DeploymentSpec(
                replicas=len(self.pods), selector=client.V1LabelSelector(match_labels=labels),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels),
                    spec=client.V1PodSpec(node_selector={"type": "kwok"}, tolerations=[
                        client.V1Toleration(key="kwok.x-k8s.io/node", operator="Exists",
                                            effect="NoSchedule")], containers=[
                        client.V1Container(name="main", image="example.invalid/w:1")])))))
        follow = threading.Thread(target=self._follow, daemon=True)
        follow.start()
        start = len(self.series)
        delay = DURATIONS[self.quick]["scale_down_delay"]
        self.patch({"autoscaling": {
            "minMembers": 1, "maxMembers": MAX_MEMBERS, "scaleDownDelaySeconds": delay,
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": SCALE_TARGET}}})
        self.hold("auto_before")
        self.work.factor = 3.0
        self.hold("auto_up")
        self.work.factor = 1.0
        self.hold("auto_down")
        series = self.series[start:]
        keda: dict[str, Any] = {}
        for k in KEDA_THRESHOLDS:
            values = [min(PARTITIONS, max(1, math.ceil(s["lag"] / k))) for s in series]
            keda[str(k)] = {"replicas": values, "changes": sum(
                1 for a, b in itertools.pairwise(values) if a != b)}
        return {"scale_changes": self.scale_events(),
                "max_members": max((s["members"] or 0) for s in series),
                "partitions": PARTITIONS, "series": series, "keda": keda}

    def _follow(self) -> None:
        """The Deployment's part: a pod and a sidecar per replica, the newest stopped
        first."""
        apps = client.AppsV1Api(self.st.api)
        n = len(self.pods)
        while not self.stop.wait(1.0):
            try:
                dep: Any = apps.read_namespaced_deployment(SCALE_TARGET, self.st.ns)
            except client.ApiException:
                continue
            want = int(dep.spec.replicas or 0)
            assert self.sidecars is not None
            if want > len(self.pods):
                new = [f"w-{n + i}" for i in range(want - len(self.pods))]
                n += len(new)
                self.st.pods(new)
                self.pods += new
                self.sidecars.add(new)
            if want < len(self.pods):
                gone = self.pods[want:]
                del self.pods[want:]
                threads = [threading.Thread(target=self.sidecars.leave, args=(pod,))
                           for pod in gone]  # SIGTERM to all, as a Deployment scaled down
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for pod in gone:
                    self.st.core.delete_namespaced_pod(pod, self.st.ns, grace_period_seconds=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (~14 min)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--capacity", type=float, default=CAPACITY_RATIO,
                        help="a member's capacity over the mean member's input at 8 members")
    args = parser.parse_args(argv)
    started = time.time()
    capacity = args.capacity * BASE_TOTAL / MEMBERS
    bench = Bench(args.quick, args.seed, capacity)
    try:
        bench.start()
        bound = round(load_bound(bench.work.base, [Assignee(f"w-{i}") for i in range(MEMBERS)]),
                      3)
        count = bench.count_phase()
        print(f"count-based: {count}", flush=True)
        load = bench.load_phase()
        print(f"load-aware:  {load}", flush=True)
        shift = bench.shift_phase()
        print(f"hot set shifted: {shift}", flush=True)
        auto = bench.autoscale_phase()
    finally:
        bench.close()
    print()
    print(f"{'':28} {'count-based':>12} {'load-aware':>12}")
    for key in ("busiest_over_mean", "moves_to_settle", "moves_steady_noisy"):
        print(f"{key:28} {count[key]:>12} {load[key]:>12}")
    print(f"{'bound (no assignment beats)':28} {bound:>12}")
    print(f"hot set shifted: {shift['moves']} moves, busiest / mean {shift['busiest_over_mean']}")
    print()
    print(f"{'t (s)':>6} {'input':>6} {'lag':>8} {'ours':>5} {'replicas':>8} {'members':>7} "
          + " ".join(f"{'KEDA ' + str(k):>9}" for k in KEDA_THRESHOLDS))
    for i, s in enumerate(auto["series"]):
        print(f"{s['t']:>6} {'x' + str(int(s['factor'])):>6} {s['lag']:>8} "
              f"{s['recommended'] or '-':>5} {s['replicas'] or '-':>8} {s['members'] or '-':>7} "
              + " ".join(f"{auto['keda'][str(k)]['replicas'][i]:>9}"
                         for k in KEDA_THRESHOLDS))
    print(f"scale changes: {auto['scale_changes']} (KEDA's rule would change replicas "
          + ", ".join(f"{auto['keda'][str(k)]['changes']} times at lagThreshold {k}"
                      for k in KEDA_THRESHOLDS) + ")")
    out = {"bound": bound, "count_based": count, "load_aware": load, "hot_shift": shift,
           "autoscale": {k: auto[k] for k in ("scale_changes", "max_members", "partitions")}
           | {"recommended": [s["recommended"] for s in auto["series"]],
              "replicas": [s["replicas"] for s in auto["series"]],
              "lag": [s["lag"] for s in auto["series"]]},
           "keda": auto["keda"], "lost": None, "duplicated": None,
           "events": "none: the apps are a model reporting rates and backlogs, no event flows",
           "capacity_per_member": capacity, "quick": args.quick,
           "seconds": round(time.time() - started), "machine": machine()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
