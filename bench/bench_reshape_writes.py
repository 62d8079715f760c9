"""What a reshape costs the API server in writes, at sizes the local control plane cannot
host: the shipped decision code (the operator's core and every member's, through
kgroup_sim, the deterministic simulation) on its simulated API server, with no fault,
counting each committed write by what it wrote.

    .venv/bin/python bench/bench_reshape_writes.py --from 1000 --to 2000 --members 10

One reshape, `spec.partitions` changed from --from to --to at --at simulated seconds; the
apps drain each sealed partition in --drain s. Printed per phase (before the change; the
reshape, from the change to the last write of a partition Lease, i.e. the last completed
release or successor acquired; after it, the steady state) and per kind of object: Lease creates,
Lease updates (acquisitions, releases, marks, expiry marks, completions, renewals), pod
writes, the group's status writes. The last line is one JSON object. Writes to the
Kubernetes API only; the stream's own writes (seal markers) are in docs/benchmarks.md,
"Reshapes on the data path".

What it does not show: the deletes of retired Leases (the simulation does not perform
them; the operator does, one conditional DELETE per retired partition, docs/reshape.md),
and the API server's watch traffic (bench/bench_cost.py measures that on a real one).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from kgroup.core.objects import Obj
from kgroup_sim.store import Store
from kgroup_sim.world import SimConfig, World


def kind_of(key: str, old: Obj | None, new: Obj | None) -> str:
    """What a committed write was: <resource> create/update/delete, a Lease split into
    partition locks and member Leases by its labels."""
    obj = new if new is not None else old
    assert obj is not None
    verb = "create" if old is None else "delete" if new is None else "update"
    resource = key.split("/", 1)[0]
    if resource == "leases":
        role = ((obj.get("metadata") or {}).get("labels") or {}).get("kgroup.dev/role", "")
        resource = f"leases({role or 'other'})"
    elif new is not None and old is not None and key.startswith("consumergroups/") \
            and old.get("status") != new.get("status"):
        verb = "status"
    return f"{resource} {verb}"


def run(*, start: int, to: int, members: int, at: float, drain: float, seed: int,
        fault_time: float) -> dict[str, Any]:
    cfg = SimConfig(members=members, partitions=start, fault_time=fault_time, kinds=(),
                    event_loss=0.0, event_replay=0.0, message_loss=0.0, slow=0.0,
                    ack_never=0.0, reshape=(to,),
                    reshape_window=(at / fault_time, at / fault_time),
                    seal_drain=(drain, drain), seal_empty=0.0)
    world = World(seed, cfg)
    log: list[tuple[float, str]] = []
    store: Store = world.store
    hook = store._on_commit

    def counting(key: str, old: Obj | None, new: Obj | None) -> None:
        log.append((world.kernel.now, kind_of(key, old, new)))
        hook(key, old, new)

    store._on_commit = counting
    result = world.run()
    if not result.reshapes:
        raise SystemExit("no reshape happened")
    changed, took = result.reshapes[0]
    if took is None:
        raise SystemExit(f"the reshape did not settle in {result.sim_time:.0f} simulated s")
    # the reshape's writes end with the last write to a partition Lease (the last
    # completed release, the last successor acquired): in steady state nobody writes one
    done = max((t for t, kind in log if t >= changed and kind.startswith("leases(partition)")),
               default=changed + took) + 1e-6
    phases = {"before": (0.0, changed), "reshape": (changed, done),
              "after": (done, result.sim_time)}
    out: dict[str, Any] = {
        "from": start, "to": to, "members": members, "seed": seed, "drain_s": drain,
        "violations": [v.kind for v in result.violations],
        "settled_s": round(took, 2), "reshape_s": round(done - changed, 2),
        "completed": result.completed,
        "successor_acquisitions": result.successor_acquisitions, "phases": {}}
    for name, (t0, t1) in phases.items():
        counts = Counter(kind for t, kind in log if t0 <= t < t1)
        seconds = max(t1 - t0, 1e-9)
        out["phases"][name] = {"seconds": round(seconds, 2), "writes": sum(counts.values()),
                               "writes_per_s": round(sum(counts.values()) / seconds, 2),
                               "by_kind": dict(sorted(counts.items()))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="start", type=int, default=1000)
    ap.add_argument("--to", type=int, default=2000)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--at", type=float, default=20.0, help="simulated s of the change")
    ap.add_argument("--drain", type=float, default=5.0,
                    help="simulated s an app takes to read a sealed partition to its end")
    ap.add_argument("--fault-time", type=float, default=60.0,
                    help="simulated s the run lasts before it checks convergence")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    out = run(start=args.start, to=args.to, members=args.members, at=args.at,
              drain=args.drain, seed=args.seed, fault_time=args.fault_time)
    for name, phase in out["phases"].items():
        print(f"{name:8} {phase['seconds']:7.1f} s  {phase['writes']:6d} writes "
              f"({phase['writes_per_s']:.1f}/s)")
        for kind, n in phase["by_kind"].items():
            print(f"           {kind:32} {n:6d}")
    print(f"reshape {out['from']} -> {out['to']}, {out['members']} members: layout settled "
          f"in {out['settled_s']} simulated s, last partition write after "
          f"{out['reshape_s']} s, {out['completed']} partitions completed, "
          f"{out['successor_acquisitions']} successor acquisitions, violations "
          f"{out['violations'] or 'none'}")
    print(json.dumps(out, sort_keys=True))
    if out["violations"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
