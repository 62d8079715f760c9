"""What one planning pass costs the operator at scale: the shipped ``decide`` on a group
of N members holding P partitions (every lock held by its target owner, marked, sessions
live), timed on this machine's CPU. Pure: no API server; the inputs are built with the
same codec the operator's cache parses.

Two passes are timed: a quiet pass (nothing to do) and a pass after one lock changed
(what each lock event of a rebalance costs). Prints mean milliseconds per pass and the
top of a cProfile with ``--profile``; asserts nothing.

With ``--load``, what one take of the load figures costs instead
(``load_status.measure_load``): every member's window full (32 distinct reports of a
rate and a lag per partition it holds, through the Lease cache), timed with nothing kept
from before (every annotation parsed) and 30 s later, after 15 new reports per member,
with the last take's parses kept (``ParsedLoads``), as the operator takes them.

    .venv/bin/python bench/bench_decide.py [--members 10] [--partitions 10000] [--passes 20]
    .venv/bin/python bench/bench_decide.py --load --members 200 --partitions 10000
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time
from datetime import UTC, datetime

from kgroup.constants import ANNOTATION_LOAD
from kgroup.core.load import encode_load
from kgroup.core.objects import Obj
from kgroup.core.operator.decide import Memory, Observation, decide, written
from kgroup.core.operator.lease_cache import GroupLeases
from kgroup.core.operator.load_status import ParsedLoads, measure_load
from kgroup.core.operator.load_window import LOAD_WINDOW_REPORTS
from kgroup.core.operator.planner import PodObservation
from kgroup.crd_models import ConsumerGroupSpec

WALL = datetime(2026, 1, 1, tzinfo=UTC)


def member_lease(member: str, rv: int) -> Obj:
    return {"metadata": {"name": f"g-member-{member}", "resourceVersion": str(rv),
                         "annotations": {"kgroup.dev/session": f"s-{member}",
                                         "kgroup.dev/epoch": "1"},
                         "labels": {"kgroup.dev/group": "g", "kgroup.dev/role": "member",
                                    "kgroup.dev/member": member}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 8}}


def lock(p: int, holder: str, rv: int, token: int = 1) -> Obj:
    return {"metadata": {"name": f"g-partition-{p}", "resourceVersion": str(rv), "uid": f"u{p}",
                         "annotations": {"kgroup.dev/assigned": holder,
                                         "kgroup.dev/assigned-uid": f"uid-{holder}",
                                         "kgroup.dev/session": f"s-{holder}",
                                         "kgroup.dev/holder-uid": f"uid-{holder}",
                                         "kgroup.dev/token": str(token)},
                         "labels": {"kgroup.dev/group": "g", "kgroup.dev/role": "partition",
                                    "kgroup.dev/partition": str(p)}},
            "spec": {"holderIdentity": holder, "leaseTransitions": token,
                     "leaseDurationSeconds": 8}}


def setup(members: int, partitions: int) -> tuple[Observation, Memory, float]:
    names = [f"w-{i}" for i in range(members)]
    now = 100.0
    leases = GroupLeases()
    for i, m in enumerate(names):
        leases.put(member_lease(m, 10 + i), now)
    pods = [PodObservation(name=n, labels={"app": "x"}, uid=f"uid-{n}") for n in names]
    body: Obj = {"metadata": {"name": "g", "namespace": "ns", "uid": "u",
                              "resourceVersion": "5", "generation": 1},
                 "spec": {"partitions": partitions, "selector": {"matchLabels": {"app": "x"}},
                          "stabilizationWindowSeconds": 0,
                          "lease": {"durationSeconds": 8, "renewIntervalSeconds": 2}},
                 "status": {}}
    memory = Memory(started_at=now)
    obs = Observation(body, leases, pods, True)
    plan = decide(obs, memory, now, wall=WALL, status_min_interval=1.0)
    assert plan.status is not None
    body = {**body, "status": plan.status, "metadata": {**body["metadata"],
                                                         "resourceVersion": "6"}}
    written(memory, plan, body, now)
    rv = 1000
    for p, m in plan.owners.items():
        rv += 1
        leases.put(lock(p, m, rv), now)
    return Observation(body, leases, pods, True), memory, now


def report(leases: GroupLeases, members: list[str], held: dict[str, list[int]], rv: int,
           now: float, rng: random.Random) -> int:
    """One renewal of every member Lease, each carrying a new load annotation."""
    for m in members:
        rv += 1
        body = member_lease(m, rv)
        text = encode_load({p: rng.uniform(10, 50) for p in held[m]},
                           {p: rng.randint(0, 50) for p in held[m]})
        assert text is not None
        body["metadata"]["annotations"][ANNOTATION_LOAD] = text
        leases.put(body, now)
    return rv


def bench_load(members: int, partitions: int) -> None:
    names = [f"w-{i}" for i in range(members)]
    held = {m: list(range(i, partitions, members)) for i, m in enumerate(names)}
    holders = {p: m for m, ps in held.items() for p in ps}
    leases, rng, rv, now = GroupLeases(), random.Random(1), 0, 0.0
    for _ in range(LOAD_WINDOW_REPORTS):
        now += 2.0
        rv = report(leases, names, held, rv, now, rng)
    spec = ConsumerGroupSpec.model_validate(
        {"partitions": partitions, "selector": {"matchLabels": {"app": "x"}}})
    parsed = ParsedLoads()
    t0 = time.perf_counter()
    measure_load(leases.member_observations(), holders, spec, names, WALL, parsed=parsed)
    cold = time.perf_counter() - t0
    for _ in range(15):
        now += 2.0
        rv = report(leases, names, held, rv, now, rng)
    t0 = time.perf_counter()
    measure_load(leases.member_observations(), holders, spec, names, WALL, parsed=parsed)
    kept = time.perf_counter() - t0
    t0 = time.perf_counter()
    measure_load(leases.member_observations(), holders, spec, names, WALL)
    anew = time.perf_counter() - t0
    print(f"{members} members x {partitions} partitions, windows of {LOAD_WINDOW_REPORTS} "
          f"reports: a take parsing every annotation {cold * 1000:.0f} ms; 30 s later "
          f"(15 new reports each) {kept * 1000:.0f} ms with the last take's parses kept, "
          f"{anew * 1000:.0f} ms without")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--load", action="store_true", help="time a take of the load figures")
    args = ap.parse_args()
    if args.load:
        bench_load(args.members, args.partitions)
        return
    obs, memory, now = setup(args.members, args.partitions)
    settle = decide(obs, memory, now, wall=WALL, status_min_interval=1.0)
    if settle.status is not None and obs.body is not None:  # the second status, stored
        stored = {**obs.body, "status": settle.status}
        written(memory, settle, stored, now)
        obs = Observation(stored, obs.leases, obs.pods, True)
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    for _ in range(args.passes):
        now += 0.01
        decide(obs, memory, now, wall=WALL, status_min_interval=1.0)
    quiet = (time.perf_counter() - t0) / args.passes
    rv = 10**7
    t0 = time.perf_counter()
    for i in range(args.passes):
        now += 0.01
        rv += 1
        p = i % args.partitions
        owner = str(obs.leases.partitions[p].holder)
        obs.leases.put(lock(p, owner, rv, token=2 + i), now)
        decide(obs, memory, now, wall=WALL, status_min_interval=1.0)
    changed = (time.perf_counter() - t0) / args.passes
    if prof:
        prof.disable()
    print(f"{args.members} members x {args.partitions} partitions: a quiet pass "
          f"{quiet * 1000:.1f} ms, a pass after one lock changed {changed * 1000:.1f} ms "
          f"(mean of {args.passes})")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
