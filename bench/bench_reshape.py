"""Reshapes with the whole group side and its members coming and going: per-key order,
losses, the pause a key sees and a crash in the middle of a drain.

On the local control plane: the real operator (a subprocess scoped to the stage's
namespace), a real ``kgroup-sidecar`` process per worker (``real_sidecars.RealSidecars``
without its tiny app), light workers as the sidecars' apps (``SidecarOwnership``: they
read their assignment from the sidecar and hand a sealed partition back with
``completed``), a private redis-server, and the reference producer following the
group's ``status.layout`` (polled from the API server every 0.1 s). The benchmark only
changes the spec; the operator, the sidecars and the workers do the rest.

Events flow at ``--rate`` for the whole run; the spec goes through ``--sequence``, one
change every ``--interval`` seconds. An item of the sequence is a partition count (a
uniform reshape: ``spec.partitions``), ``s<P>`` (split partition P of the newest
generation: ``spec.reshape.change`` with ``spec.partitions`` one more) or ``m<P>+<Q>``
(merge two adjacent ones: one fewer). Partition numbers are never reused: after
``16,24,8,16`` the newest generation is 48-63, so ``16,24,8,16,s50,m48+49`` splits and
merges in it.

Members come and go during the run, deterministically for a ``--seed`` (the schedule is
printed before the run, and is in the JSON):

- ``--crashes`` (default 1): right after a reshape, the SIGKILL of the sidecar of a
  worker that holds partitions the reshape replaced, and its app stopped without any
  release. So that they are still draining when it dies, its app stops taking batches
  ``--crash-stall`` seconds before the reshape (a slow app); it is killed once the new
  generation is in ``status.layout`` (and so sealed by the producer). Its pod stays (a node
  lost): the operator marks its session expired after the Lease duration (6 s here), and
  another member takes the sealed partitions over, reads them to their seal and
  completes them. Timed: from the kill to another member holding all of them, and to all
  of them completed.
- ``--joins`` (default 1): a new pod, a new real sidecar and light worker.
- ``--leaves`` (default 1): SIGTERM to a worker's sidecar (a pod deleted): the sidecar
  revokes everything, the light worker keeps running until the sidecar is gone and hands
  each partition back (a sealed one read to its seal as completed, else at its committed
  offset); then the app stops and the pod is deleted.

A crash takes a reshape of its own (chosen by the seed); joins and leaves take the other
slots, each either 0.5 s after a reshape (while its predecessors drain) or halfway
between two changes (or after the last). ``steady``: for comparison, the latency of
every 10th event of the first generation before the first change or churn.

The pause a key sees at a reshape is measured as in ``bench_reshape_pipeline.py`` (from
its first event written to a successor to the first time the successor's sink lists the
key), and so includes the operator's and sidecars' hand-over: the completion recorded on
the Lease, the operator's next pass, the successor's Lease created and marked, the
sidecar's acquisition, the worker's next plan; after a crash also the session's expiry.

    .venv/bin/python bench/bench_reshape.py [--sequence 16,24,8,16] [--rate 2000]
        [--seed 1] [--joins 1] [--leaves 1] [--crashes 1]

Prints the verifier's table, then one JSON object on its last line; exit 1 on any loss,
duplicate or key out of order.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from bench_reshape_pipeline import STREAM, FirstSeen, first_written, pct, steady_latencies
from real_sidecars import RealSidecars
from stage import Stage, machine, wait_until

from kgroup import constants as C
from kgroup.client import SidecarClient
from kgroup.core.layout_status import layout_from_status
from kgroup.core.lineage import State
from kgroup.producer import Lineage, Merge, Split, Uniform, initial
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import SidecarOwnership
from kgroup_pipeline.producer import Produced, produce
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify

LEASE_SECONDS = 6
Change = Uniform | Split | Merge


def parse_change(item: str) -> Change:
    """``24`` (uniform), ``s5`` (split 5), ``m5+6`` (merge 5 and 6)."""
    item = item.strip()
    if item.startswith("s"):
        return Split(int(item[1:]))
    if item.startswith("m"):
        left, _, right = item[1:].partition("+")
        return Merge(int(left), int(right))
    return Uniform(int(item))


def patch_for(change: Change, lineage: Lineage) -> dict[str, Any]:
    """The spec patch that makes ``change`` the generation after ``lineage``'s newest."""
    if isinstance(change, Uniform):
        return {"spec": {"partitions": change.count}}
    count = len(lineage.latest.partitions) + (1 if isinstance(change, Split) else -1)
    what: dict[str, Any] = {"split": change.partition, "merge": None} \
        if isinstance(change, Split) else {"merge": [change.left, change.right], "split": None}
    return {"spec": {"partitions": count, "reshape": {"change": {
        "generation": lineage.latest.number + 1, **what}}}}


class StatusLayout:
    """The group's ``status.layout``, polled from the API server; ``lineage`` is the
    latest decoded (what a producer's watch would hold), never older than the last.
    ``done_at``: when each replaced partition was first seen completed (or retired)."""

    def __init__(self, st: Stage, partitions: int) -> None:
        self.st = st
        self.lineage: Lineage = initial(partitions)
        self.generation_of: dict[int, int] = {p: 1 for p in range(partitions)}
        self.done_at: dict[int, float] = {}
        self.most_waiting = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="layout", daemon=True)

    def __call__(self) -> Lineage:
        return self.lineage

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                raw = self.st.status().get("layout")
            except Exception:  # the API server busy: the next poll
                continue
            if raw is None:
                continue
            lineage = layout_from_status(raw, len(self.lineage.latest.partitions))
            if lineage.latest.number < self.lineage.latest.number:
                continue
            now = time.monotonic()
            for p in lineage.completed | (self.lineage.partitions - lineage.partitions):
                self.done_at.setdefault(p, now)
            self.lineage = lineage
            for p in lineage.latest.partitions:
                self.generation_of.setdefault(p, lineage.latest.number)
            waiting = len(lineage.partitions - lineage.completed - lineage.assignable())
            self.most_waiting = max(self.most_waiting, waiting)

    def done(self, partition: int) -> bool:
        lin = self.lineage
        return partition in self.done_at or partition not in lin.partitions \
            or lin.state(partition) is State.COMPLETED


class Workers:
    """One light worker per sidecar, each in a thread of this process; one can be
    stalled (it takes no batch until stopped) and stopped with or without a hand-back."""

    def __init__(self, url: str, max_rows: int) -> None:
        self.url, self.max_rows = url, max_rows
        self.stops: dict[str, threading.Event] = {}
        self.stalls: dict[str, threading.Event] = {}
        self.parked: dict[str, threading.Event] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.errors = 0

    def start(self, pod: str, port: int) -> None:
        worker = LightWorker(client=redis.Redis.from_url(self.url, decode_responses=True),
                             stream=STREAM, max_rows=self.max_rows, idle_wait=0.01,
                             ownership=SidecarOwnership(f"http://127.0.0.1:{port}"))
        self.stops[pod], self.stalls[pod], self.parked[pod] = (
            threading.Event(), threading.Event(), threading.Event())
        self.threads[pod] = threading.Thread(target=self._loop, args=(pod, worker),
                                             name=f"worker-{pod}", daemon=True)
        self.threads[pod].start()

    def _loop(self, pod: str, worker: LightWorker) -> None:
        stop, stall, parked = self.stops[pod], self.stalls[pod], self.parked[pod]
        while not stop.is_set():
            if stall.is_set():
                parked.set()
                stop.wait(0.05)
                continue
            try:
                if worker.run_once() == 0:
                    time.sleep(0.01)
            except Exception:  # a sidecar answer lost, or the sidecar gone: the next batch
                self.errors += 1
                time.sleep(0.1)

    def stall(self, pod: str) -> None:
        """No more batches from ``pod`` (returns once its current one is over)."""
        self.stalls[pod].set()
        self.parked[pod].wait(30)

    def stop(self, pod: str) -> None:
        """The loop ends where it is: nothing handed back (a stalled worker does nothing
        more at all)."""
        self.stops[pod].set()
        self.threads[pod].join(timeout=30)

    def close(self) -> None:
        for stop in self.stops.values():
            stop.set()
        for t in self.threads.values():
            t.join(timeout=10)


@dataclass(order=True)
class Step:
    at: float
    order: int
    kind: str = field(compare=False)  # reshape | stall | crash | join | leave
    change: Change | None = field(default=None, compare=False)
    index: int = field(default=0, compare=False)  # which reshape (1, 2, ...)


def schedule(args: argparse.Namespace, changes: list[Change]) -> list[Step]:
    """The run's steps, the same for the same flags and ``--seed``."""
    rng = random.Random(args.seed)
    iv = args.interval
    steps = [Step(iv * i, 1, "reshape", c, i) for i, c in enumerate(changes[1:], start=1)]
    reshapes = list(range(1, len(changes)))
    crashed = sorted(rng.sample(reshapes, min(args.crashes, len(reshapes))))
    for i in crashed:
        steps += [Step(iv * i - args.crash_stall, 0, "stall", index=i),
                  Step(iv * i, 2, "crash", index=i)]
    during = [iv * i + 0.5 for i in reshapes if i not in crashed]
    between = [iv * i + iv / 2 for i in reshapes]
    kinds = ["join"] * args.joins + ["leave"] * args.leaves
    rng.shuffle(kinds)
    for k, kind in enumerate(kinds):  # alternately while a drain runs and between
        pool = (during, between)[k % 2] or during or between
        if not pool:
            pool = [iv * i + iv / 2 for i in reshapes] or [iv / 2]
            during, between = [], pool.copy()
        when = pool.pop(rng.randrange(len(pool)))
        steps.append(Step(when + 0.01 * k, 3, kind))
    return sorted(steps)


@dataclass
class Crash:
    pod: str
    reshape: int
    at_s: float = 0.0
    killed: float = 0.0
    partitions: list[int] = field(default_factory=list)
    taken_over: float | None = None
    completed: float | None = None


class Churn:
    """Joins, leaves and crashes of members while events flow."""

    def __init__(self, st: Stage, sidecars: RealSidecars, workers: Workers,
                 layout: StatusLayout, seed: int) -> None:
        self.st, self.sidecars, self.workers, self.layout = st, sidecars, workers, layout
        self.rng = random.Random(seed + 1)
        self.alive: list[str] = list(sidecars.ports)
        self.next_pod = len(self.alive)
        self.crashes: list[Crash] = []
        self.log: list[dict[str, Any]] = []
        self.threads: list[threading.Thread] = []
        self.joined = self.left = 0
        self.join_to_owning: list[float] = []
        self.leave_to_gone: list[float] = []

    def held(self, pod: str) -> set[int]:
        port = self.sidecars.ports[pod]
        return {p.partition for p in SidecarClient(f"http://127.0.0.1:{port}", timeout=5)
                .assignment().partitions}

    def join(self, at: float) -> None:
        pod = f"w{self.next_pod}"
        self.next_pod += 1
        self.log.append({"at_s": round(at, 1), "step": "join", "pod": pod})

        def run() -> None:
            t = time.monotonic()
            self.st.pods([pod])
            self.sidecars.add([pod])
            # its app starts once the sidecar answers (before, it only logs each refusal)
            wait_until(f"{pod}'s sidecar up", lambda: self.held(pod) is not None,
                       timeout=120, interval=0.2)
            self.workers.start(pod, self.sidecars.ports[pod])
            self.alive.append(pod)
            self.joined += 1
            try:
                wait_until(f"{pod} owning", lambda: self.held(pod), timeout=60, interval=0.1)
                self.join_to_owning.append(round(time.monotonic() - t, 2))
            except TimeoutError:
                pass
        self._spawn(run)

    def leave(self, at: float) -> None:
        stalled = {c.pod for c in self.crashes}
        able = [p for p in self.alive if p not in stalled]
        if len(able) < 2:
            self.log.append({"at_s": round(at, 1), "step": "leave", "pod": None,
                             "skipped": "too few members"})
            return
        pod = self.rng.choice(sorted(able))
        self.alive.remove(pod)
        self.log.append({"at_s": round(at, 1), "step": "leave", "pod": pod})

        def run() -> None:
            t = time.monotonic()
            self.sidecars.leave(pod)  # its app releases what is revoked meanwhile
            self.leave_to_gone.append(round(time.monotonic() - t, 2))
            self.workers.stop(pod)
            self.st.core.delete_namespaced_pod(pod, self.st.ns, grace_period_seconds=0)
            self.left += 1
        self._spawn(run)

    def stall(self, at: float, index: int, change: Change) -> None:
        """Choose the victim of the crash after reshape ``index``: a member holding
        partitions ``change`` replaces; its app takes no more batches."""
        lin = self.layout.lineage
        replaced = set(lin.latest.partitions) - set(lin.reshape(change).latest.partitions)
        holding = []
        for pod in sorted(self.alive):
            try:
                if self.held(pod) & replaced:
                    holding.append(pod)
            except Exception:  # a sidecar not answering: not a candidate
                continue
        if not holding or len(self.alive) < 2:
            self.log.append({"at_s": round(at, 1), "step": "crash", "pod": None,
                             "skipped": "no member holds a replaced partition"})
            return
        pod = self.rng.choice(holding)
        self.workers.stall(pod)
        self.alive.remove(pod)
        self.crashes.append(Crash(pod, index))

    def crash(self, at: float, index: int, generation: int) -> None:
        """Once ``generation`` is in ``status.layout``: SIGKILL the stalled member's
        sidecar, end its app without a release."""
        crash = next((c for c in self.crashes if c.reshape == index), None)
        if crash is None:
            return
        wait_until(f"generation {generation} in status.layout",
                   lambda: self.layout.lineage.latest.number >= generation, timeout=30)
        time.sleep(0.2)  # the producer's seal markers written
        lin = self.layout.lineage
        held = self.held(crash.pod)
        crash.partitions = sorted(p for p in held
                                  if p in lin.partitions and lin.state(p) is State.SEALED)
        crash.killed = self.sidecars.crash(crash.pod)
        crash.at_s = round(at, 1)
        self.workers.stop(crash.pod)
        self.log.append({"at_s": round(at, 1), "step": "crash", "pod": crash.pod,
                         "sealed_held": crash.partitions})
        self._spawn(lambda: self._watch(crash))

    def _watch(self, crash: Crash) -> None:
        """Until every sealed partition the victim held is completed: when another member
        held them all (Lease holders), when all were completed (``status.layout``)."""
        todo = set(crash.partitions)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if crash.taken_over is None:
                try:
                    holders = self.st.holders()
                except Exception:  # the API server busy: the next look
                    holders = None
                if holders is not None and all(
                        self.layout.done(p) or holders.get(p) not in (None, crash.pod)
                        for p in todo):
                    crash.taken_over = time.monotonic() - crash.killed
            if all(self.layout.done(p) for p in todo):
                done = max((self.layout.done_at.get(p, time.monotonic()) for p in todo),
                           default=crash.killed)
                crash.completed = max(0.0, done - crash.killed)
                crash.taken_over = min(crash.taken_over or crash.completed, crash.completed)
                return
            time.sleep(0.2)

    def _spawn(self, target: Any) -> None:
        t = threading.Thread(target=target, daemon=True)
        self.threads.append(t)
        t.start()

    def join_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))


def describe(step: Step) -> str:
    c = step.change
    what = (f"partitions {c.count}" if isinstance(c, Uniform) else f"split {c.partition}"
            if isinstance(c, Split) else f"merge {c.left}+{c.right}" if isinstance(c, Merge)
            else "")
    return f"{step.at:6.2f} s  {step.kind} {what}".rstrip()


def run(args: argparse.Namespace, st: Stage, url: str, client: redis.Redis) -> dict[str, Any]:
    changes = [parse_change(c) for c in args.sequence.split(",")]
    if not isinstance(changes[0], Uniform):
        raise SystemExit("the sequence starts with a partition count")
    first = changes[0].count
    steps = schedule(args, changes)
    print("schedule (seconds after the producer starts):", file=sys.stderr)
    for step in steps:
        print("  " + describe(step), file=sys.stderr)
    pods = [f"w{i}" for i in range(args.workers)]
    st.create_group(partitions=first, window=0, duration=LEASE_SECONDS, renew=2, drain=10)
    st.start_operator()
    st.pods(pods)
    sidecars = RealSidecars(st, pods, args.base_port, app=False)
    layout = StatusLayout(st, first)
    workers = Workers(url, args.max_rows)
    churn: Churn | None = None
    try:
        for pod, port in sidecars.ports.items():
            # the apps start once their sidecars answer (before, each refusal is logged)
            wait_until(f"{pod}'s sidecar up", lambda u=f"http://127.0.0.1:{port}":
                       SidecarClient(u, timeout=5).assignment(), timeout=120, interval=0.2)
            workers.start(pod, port)
        wait_until("the group stable", lambda: st.stable_with(len(pods)), timeout=120)
        churn = Churn(st, sidecars, workers, layout, args.seed)
        layout.thread.start()
        first_seen = FirstSeen(redis.Redis.from_url(url, decode_responses=True), layout)
        first_seen.thread.start()
        duration = args.interval * len(changes)
        produced: list[Produced] = []
        producer = threading.Thread(target=lambda: produced.append(produce(
            redis.Redis.from_url(url, decode_responses=True), stream=STREAM,
            layout=layout, duration=duration, rate=args.rate, keys=args.keys,
            seed=args.seed, chunk=max(1, int(args.rate // 20)))))
        start, wall = time.monotonic(), time.time()
        producer.start()
        generation = 1
        for step in steps:
            while time.monotonic() - start < step.at:
                time.sleep(0.02)
            now = time.monotonic() - start
            change = changes[step.index] if step.index else None
            if step.kind == "reshape":
                assert step.change is not None
                wait_until(f"generation {generation} in status.layout",
                           lambda g=generation: layout.lineage.latest.number >= g, timeout=60)
                st.custom.patch_namespaced_custom_object(
                    C.API_GROUP, C.API_VERSION, st.ns, C.PLURAL, st.group,
                    patch_for(step.change, layout.lineage))
                generation += 1
            elif step.kind == "stall":
                assert change is not None
                churn.stall(now, step.index, change)
            elif step.kind == "crash":
                churn.crash(now, step.index, generation)
            elif step.kind == "join":
                churn.join(now)
            elif step.kind == "leave":
                churn.leave(now)
        producer.join()
        deadline = time.monotonic() + args.settle

        def done() -> bool:
            lin = layout.lineage
            return len(lin.generations) == 1 and verify(client, STREAM).caught_up

        while not done() and time.monotonic() < deadline:
            time.sleep(0.2)
        churn.join_all(max(1.0, deadline - time.monotonic()))
        time.sleep(0.1)
        first_seen.stop.set()
        first_seen.thread.join()
        seconds = time.monotonic() - start
    finally:
        layout.stop.set()
        workers.close()
        sidecars.close()
    report = verify(client, STREAM)
    print(render(report))
    by_gen: dict[int, list[float]] = {}
    for p, g in layout.generation_of.items():
        for key, written in first_written(client, p).items():
            seen = first_seen.seen.get((p, key))
            if seen is not None:
                by_gen.setdefault(g, []).append(max(0.0, seen - written))
    by_gen.pop(1, None)  # a key's first event at start-up: no reshape in its way
    pauses = [x for xs in by_gen.values() for x in xs]
    quiet = min([args.interval] + [s.at for s in steps if s.kind != "reshape"])
    steady = steady_latencies(client, first_seen, list(range(first)), wall + 1,
                              wall + quiet - 0.2)  # before the first change or churn
    crashes = churn.crashes if churn is not None else []
    return {
        "sequence": args.sequence, "rate": args.rate, "keys": args.keys,
        "workers": args.workers, "interval_s": args.interval, "seed": args.seed,
        "produced": report.total("produced"), "committed": report.total("committed"),
        "lost": report.total("lost"), "duplicated": report.total("duplicated"),
        "keys_lost": report.keys_lost, "keys_duplicated": report.keys_duplicated,
        "keys_out_of_order": report.keys_out_of_order, "past_seal": report.total("past_seal"),
        "generations": report.generations, "caught_up": report.caught_up,
        "generations_kept_at_end": len(layout.lineage.generations),
        "sealed_partitions": len(client.hgetall(StreamKeys(STREAM).seals)),
        "producer_refused": sum(p.refused for p in produced),
        "pause_p50_s": pct(pauses, 0.5), "pause_p99_s": pct(pauses, 0.99),
        "pause_max_s": pct(pauses, 1.0), "pause_samples": len(pauses),
        "steady_p50_s": pct(steady, 0.5) if steady else None,
        "steady_p99_s": pct(steady, 0.99) if steady else None,
        "pause_by_generation": {g: [pct(xs, 0.5), pct(xs, 0.99)]
                                for g, xs in sorted(by_gen.items())},
        "most_partitions_waiting": layout.most_waiting,
        "joins": churn.joined if churn is not None else 0,
        "leaves": churn.left if churn is not None else 0,
        "crashes": len([c for c in crashes if c.killed]),
        "lease_duration_s": LEASE_SECONDS,
        "crash_sealed_partitions": [len(c.partitions) for c in crashes],
        "crash_to_taken_over_s": [None if c.taken_over is None else round(c.taken_over, 2)
                                  for c in crashes],
        "crash_to_completed_s": [None if c.completed is None else round(c.completed, 2)
                                 for c in crashes],
        "join_to_owning_s": churn.join_to_owning if churn is not None else [],
        "leave_to_gone_s": churn.leave_to_gone if churn is not None else [],
        "churn": churn.log if churn is not None else [],
        "worker_errors": workers.errors,
        "seconds": round(seconds, 1),
        "machine": machine(st.cluster),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_reshape")
    ap.add_argument("--sequence", default="16,24,8,16",
                    help="partition counts, s<P> (split P) or m<P>+<Q> (merge P and Q)")
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=20.0,
                    help="seconds between changes of the spec")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1,
                    help="the churn's schedule and victims, and the producer's keys")
    ap.add_argument("--joins", type=int, default=1)
    ap.add_argument("--leaves", type=int, default=1)
    ap.add_argument("--crashes", type=int, default=1,
                    help="crashes of a member holding replaced partitions, each right "
                         "after a reshape of its own")
    ap.add_argument("--crash-stall", type=float, default=1.0,
                    help="seconds the victim's app takes no batch before the reshape")
    ap.add_argument("--max-rows", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=300.0)
    ap.add_argument("--base-port", type=int, default=18470)
    args = ap.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(threadName)s %(name)s: %(message)s",
                        level=logging.WARNING)
    st = Stage("bench-reshape")
    try:
        with RedisServer() as server:
            result = run(args, st, server.url, server.client())
    finally:
        try:
            st.close()
        except Exception as exc:  # the control plane gone first: the figures still stand
            print(f"closing the stage: {exc!r}", file=sys.stderr)
    print(json.dumps(result))
    ok = result["lost"] == result["duplicated"] == result["keys_out_of_order"] == 0 \
        and result["caught_up"] and None not in result["crash_to_completed_s"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
