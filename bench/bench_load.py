"""Load-aware assignment and autoscaling on the local control plane, with real sidecars,
real consumers and real events.

The real operator and eight pods, each a real ``kgroup-sidecar`` process and its app: the
project's light worker (``python -m kgroup_pipeline.light_worker``, a process per pod)
capped with its ``--max-rate`` at ``--capacity`` x the mean member's input at 8 members
(default 3.5: 280 events/s). They share 64 partitions of Redis Streams on a private
``redis-server`` (127.0.0.1), whose inputs follow Zipf (s = 0.8, 640 events/s in all): a
producer (``load_stream.Feed``, the project's ``EventWriter`` with its ledger) writes each
partition's input at its rate. A member with more input than its capacity really falls
behind; each worker reports its rate and lag to its sidecar as it always does, commits
output and offsets fenced by the partition's token, and a moved partition resumes where
its old owner committed. At the end the producer stops, the members catch up, and the
project's verifier (``kgroup_pipeline.verify``) counts lost and duplicated events over
everything produced: the JSON's ``lost``/``duplicated`` are its numbers (``events``: what
was produced and verified). The bench also plays the kubelet: a worker that exits is
started again (``worker_restarts``); a write Redis fails is counted (``producer_errors``),
its events either written with the ledger or not at all.

Phases, one group (figures side by side):

1. count-based assignment (the default), settled, then +-20 % noise on every partition's
   input re-drawn every 20 s: busiest / mean, moves;
2. ``spec.balance.mode: load``: moves to settle, busiest / mean; then the same noise:
   moves;
3. the hot set shifted (the rates permuted): moves, busiest / mean;
4. ``spec.autoscaling`` (1..32 members, a real Deployment as the target, scale-down delay
   60 s with ``--quick``): the input x3, then back. The bench plays the Deployment's
   part: it starts a pod (sidecar and worker) for each replica the operator sets, and
   deletes the newest when it lowers them (SIGTERM to both). Recommended members and
   replicas over time, the number of scale changes; beside them what KEDA's lag rule
   (replicas = ceil(total lag / lagThreshold), at most the partitions) recommends from
   the same lag series (the streams' entries not yet committed, read every 5 s).

Busiest / mean is computed from the true inputs (noise off) over the lock holders read
from the API server, not from the reports. Moves are the partitions whose target owner
changed (the operator's RebalanceStarted Events).

    .venv/bin/python bench/bench_load.py --quick     # about 15 minutes

Last run (docs/benchmarks.md, ``docs/bench/load_quick.json``): 703,825 events produced
and committed, 0 lost, 0 duplicated.

Exit 0 when the verifier found nothing lost or duplicated and every partition caught up.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_stream import STREAM, Feed, backlog, verification
from real_sidecars import RealSidecars
from stage import Stage, machine, wait_until

from kgroup import constants as C
from kgroup.core.operator.assignors import Assignee
from kgroup.core.operator.load_balance import load_bound
from kgroup_pipeline.redis_server import RedisServer

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
    """Every partition's input (events/s): Zipf over a shuffled placement, times the
    step's factor, times the noise when it is on."""

    def __init__(self, rng: random.Random) -> None:
        weights = [1.0 / rank ** ZIPF_S for rank in range(1, PARTITIONS + 1)]
        rng.shuffle(weights)
        total = sum(weights)
        self.rng = rng
        self.base = [BASE_TOTAL * w / total for w in weights]
        self.noise = [1.0] * PARTITIONS
        self.factor = 1.0
        self.noisy = False
        self.lock = threading.Lock()

    def rates(self) -> list[float]:
        with self.lock:
            return [b * self.factor * n for b, n in zip(self.base, self.noise, strict=True)]

    def redraw(self) -> None:
        with self.lock:
            self.noise = [self.rng.uniform(1 - NOISE, 1 + NOISE) if self.noisy else 1.0
                          for _ in range(PARTITIONS)]

    def shift(self) -> None:
        with self.lock:
            self.rng.shuffle(self.base)

    def busiest_over_mean(self, holders: dict[int, str | None]) -> float:
        """The busiest member's true input (noise off) over the mean member's."""
        with self.lock:
            per: dict[str, float] = {}
            for p, h in holders.items():
                if h:
                    per[h] = per.get(h, 0.0) + self.base[p]
            if not per:
                return float("nan")
            return float(round(max(per.values()) / (sum(self.base) / len(per)), 3))


class Members:
    """The pods' two containers: a real sidecar (``RealSidecars`` without its tiny app, the
    app's part on: a pod joins when its app first asks) and the light worker as its app, a
    process capped at ``capacity`` events/s. A worker that exits is started again, as the
    kubelet restarts a container (``restarts``). A leave is a pod's deletion: SIGTERM to
    both."""

    def __init__(self, st: Stage, pods: list[str], base_port: int, redis_url: str,
                 capacity: float) -> None:
        self.st, self.redis_url, self.capacity = st, redis_url, capacity
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.lock = threading.Lock()
        self.restarts = 0
        self.sidecars = RealSidecars(st, [], base_port, app=False, app_timeout=None)
        self.add(pods)

    def add(self, pods: list[str]) -> None:
        self.sidecars.add(pods)
        for pod in pods:
            port = self.sidecars.ports[pod]
            wait_until(f"{pod}'s sidecar listening", lambda port=port: listening(port),
                       timeout=60, interval=0.2)
            with self.lock:
                self.workers[pod] = self._worker(pod, port)

    def _worker(self, pod: str, port: int) -> subprocess.Popen[bytes]:
        with (self.st.workdir / f"worker-{pod}.log").open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "kgroup_pipeline.light_worker",
                 "--redis", self.redis_url, "--stream", STREAM,
                 "--sidecar", f"http://127.0.0.1:{port}", "--drain-timeout", "10",
                 "--max-rate", f"{self.capacity:g}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "NO_PROXY": "127.0.0.1,localhost"})

    def restart_exited(self) -> None:
        with self.lock:
            for pod, proc in list(self.workers.items()):
                if proc.poll() is not None and pod in self.sidecars.ports:
                    self.workers[pod] = self._worker(pod, self.sidecars.ports[pod])
                    self.restarts += 1

    def leave(self, pod: str) -> None:
        with self.lock:
            worker = self.workers.pop(pod)
        worker.terminate()  # the app hands its partitions back at their committed offsets
        self.sidecars.leave(pod)
        worker.wait(60)

    def close(self) -> None:
        with self.lock:
            workers, self.workers = list(self.workers.values()), {}
        for worker in workers:
            worker.terminate()
        self.sidecars.close()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Bench:
    def __init__(self, quick: bool, seed: int, capacity: float) -> None:
        self.quick = quick
        self.seed = seed
        self.capacity = capacity
        self.st = Stage("bench-load")
        self.work = Workload(random.Random(seed))
        self.stop = threading.Event()
        self.feeding = threading.Event()
        self.pods: list[str] = []
        self.members: Members | None = None
        self.redis = RedisServer()
        self.client: redis.Redis = redis.Redis()
        self.feed: Feed | None = None
        self.series: list[dict[str, Any]] = []
        self.threads: list[threading.Thread] = []

    # -- the world -----------------------------------------------------------------------

    def start(self) -> None:
        st = self.st
        st.room_for(MAX_MEMBERS + 8)
        self.redis.start()
        self.client = self.redis.client()
        self.feed = Feed(self.client, PARTITIONS, self.work.rates, seed=self.seed)
        st.create_group(partitions=PARTITIONS, window=2, duration=8, renew=2, drain=10)
        self.pods = [f"w-{i}" for i in range(MEMBERS)]
        st.pods(self.pods)
        st.start_operator()
        self.members = Members(st, list(self.pods), free_ports(MAX_MEMBERS + 8),
                               self.redis.url, self.capacity)
        for target in (self._feed, self._noise, self._sample, self._kubelet):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)

    def _feed(self) -> None:
        assert self.feed is not None
        self.feed.run(self.feeding)

    def _noise(self) -> None:
        while not self.stop.wait(NOISE_EVERY):
            self.work.redraw()

    def _kubelet(self) -> None:
        while not self.stop.wait(2.0):
            if self.members is not None:
                self.members.restart_exited()

    def _sample(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(5.0):
            try:
                st = self.st.status()
                lag = backlog(self.client, PARTITIONS)
            except (client.ApiException, redis.RedisError):
                continue
            load = st.get("load") or {}
            auto = st.get("autoscaling") or {}
            self.series.append({"t": round(time.monotonic() - t0), "lag": lag,
                                "recommended": load.get("recommendedMembers"),
                                "capacity": load.get("capacity"),
                                "arrival": load.get("arrival"), "rate": load.get("rate"),
                                "replicas": auto.get("replicas"),
                                "members": st.get("memberCount"),
                                "factor": self.work.factor})

    def busiest_over_mean(self) -> float:
        return self.work.busiest_over_mean(self.st.holders())

    def verify(self, wait: float = 300.0) -> dict[str, Any]:
        """The producer stopped, the members' catch-up waited for: the verifier's count."""
        self.feeding.set()
        for t in self.threads[:1]:
            t.join(timeout=30)
        events: dict[str, Any] = verification(self.client, wait=wait)
        assert self.feed is not None and self.members is not None
        events["producer_errors"] = self.feed.errors
        events["worker_restarts"] = self.members.restarts
        return events

    def close(self) -> None:
        self.feeding.set()
        self.stop.set()
        if self.members is not None:
            self.members.close()
        self.st.close()
        self.redis.stop()

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
        ratio = self.busiest_over_mean()
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
        ratio = self.busiest_over_mean()
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
                self.busiest_over_mean()}

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
            assert self.members is not None
            if want > len(self.pods):
                new = [f"w-{n + i}" for i in range(want - len(self.pods))]
                n += len(new)
                self.st.pods(new)
                self.pods += new
                self.members.add(new)
            if want < len(self.pods):
                gone = self.pods[want:]
                del self.pods[want:]
                threads = [threading.Thread(target=self.members.leave, args=(pod,))
                           for pod in gone]  # SIGTERM to all, as a Deployment scaled down
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for pod in gone:
                    self.st.core.delete_namespaced_pod(pod, self.st.ns, grace_period_seconds=0)


def show(count: dict[str, Any], load: dict[str, Any], shift: dict[str, Any],
         auto: dict[str, Any], bound: float, events: dict[str, Any]) -> None:
    """The tables, for a reader of the output (the JSON follows them)."""
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
    print(f"verifier: {events['produced']} produced, {events['verified']} committed, "
          f"lost {events['lost']}, duplicated {events['duplicated']}, pending "
          f"{events['pending']}, out of order {events['keys_out_of_order']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (~15 min)")
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
        events = bench.verify()
    finally:
        bench.close()
    show(count, load, shift, auto, bound, events)
    out = {"bound": bound, "count_based": count, "load_aware": load, "hot_shift": shift,
           "autoscale": {k: auto[k] for k in ("scale_changes", "max_members", "partitions")}
           | {"recommended": [s["recommended"] for s in auto["series"]],
              "replicas": [s["replicas"] for s in auto["series"]],
              "lag": [s["lag"] for s in auto["series"]],
              "capacity": [s["capacity"] for s in auto["series"]],
              "arrival": [s["arrival"] for s in auto["series"]],
              "rate": [s["rate"] for s in auto["series"]]},
           "keda": auto["keda"], "lost": events["lost"], "duplicated": events["duplicated"],
           "events": events, "capacity_per_member": capacity, "quick": args.quick,
           "seconds": round(time.time() - started), "machine": machine()}
    print(json.dumps(out))
    return 0 if events["clean"] and events["caught_up"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
