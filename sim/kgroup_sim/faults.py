"""The faults of a simulated run: drawn at random during the fault phase, or scripted.

Process faults (crash, GC pause, network cut, a member joining or leaving, the operator
restarting) are made here; hand edits of the stored objects are made by
:mod:`kgroup_sim.hand_edits`. The random draws come in a fixed order: another order would
change every pinned seed's run (scripts/sim_trace_hashes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kgroup_sim.hand_edits import EDIT_KINDS, inject_edit

if TYPE_CHECKING:
    from kgroup_sim.world import World

FAULT_KINDS = ("crash", "gc-pause", "net-cut", "operator-restart", "join", "leave")
"""Process faults drawn at random; message faults (lost/duplicated events, lost
requests or answers, slow messages) are drawn per message during the fault phase.
Scripted only: ``lose-answer`` (the member's next answer from the API server is lost),
``rollout-join`` (a member joins with the next revision of the Deployment: a rollout's
new pod; ``SimConfig.revision`` gives the first members' pods a Deployment's revision),
``status-reset`` (the group's status is emptied, as by a restore from a backup
without status, and the operator restarts ``seconds`` later), ``spec-change`` (the
spec is edited: ``member`` more partitions, a new generation), ``lock-deleted`` (an admin
deletes partition ``member``'s Lease) and ``group-reapplied`` (the ConsumerGroup is
deleted, the garbage collector deletes the Leases it owns, and the same group is applied
again ``seconds`` later: a new uid, an empty status), ``recreate`` (a member's pod is
deleted and created again under its name ``seconds`` later: another uid, as a
StatefulSet's pod comes back) and ``impostor`` (a member's pod is deleted and a bare pod
is created under its name at once, running a sidecar of its own: with
``SimConfig.statefulset`` it must take nothing within the restart grace)."""


@dataclass(frozen=True)
class Fault:
    """A scripted fault: ``kind`` at true time ``at``, on member number ``member`` (its
    index among the live members sorted by name), lasting ``seconds``; ``same_name``:
    a crashed member returns under its own name."""

    at: float
    kind: str
    member: int = 0
    seconds: float = 0.0
    same_name: bool = True


def random_fault(world: World) -> None:
    """Draw a fault of ``SimConfig.kinds`` now, inject it, and draw when the next comes."""
    if not world.faulty:
        return
    kind = world.rng.choice(world.cfg.kinds) if world.cfg.kinds else None
    if kind is not None:
        names = world.live_names()
        member = world.rng.randrange(max(1, len(names)))
        if kind == "lock-deleted":
            member = world.rng.randrange(world.spec.partitions)
        duration = float(world.spec.lease.duration_seconds)
        seconds = {
            "crash": world.rng.uniform(0.5, 3 * duration),
            "gc-pause": world.rng.choice([world.rng.uniform(0.1, duration),
                                          world.rng.uniform(duration, 2.5 * duration)]),
            "net-cut": world.rng.uniform(0.5, 2 * duration),
            "operator-restart": world.rng.uniform(0.0, 5.0),
            "group-reapplied": world.rng.uniform(0.0, 5.0),
        }.get(kind, 0.0)
        inject(world, Fault(world.kernel.now, kind, member, seconds,
                            same_name=world.rng.random() < 0.5))
    world.kernel.after(world.rng.expovariate(world.cfg.fault_rate), random_fault, world)


def inject(world: World, fault: Fault) -> None:
    """Make ``fault`` happen now (a gc-pause or net-cut that would outlast the fault
    phase is not made)."""
    names = world.live_names()
    end = world.kernel.now + fault.seconds
    if fault.kind == "operator-restart":
        assert world.operator_proc is not None
        world.count(fault.kind)
        world.trace("fault", fault)
        world.operator_proc.crash()
        world.kernel.after(fault.seconds, world.start_operator)
        return
    if fault.kind in EDIT_KINDS:
        inject_edit(world, fault)
        return
    if fault.kind in ("join", "rollout-join"):
        if len(names) < world.cfg.members + 2:
            world.count(fault.kind)
            world.trace("fault", fault)
            world.start_member(revision=None if fault.kind == "join" else
                               f"{world.cfg.revision}-next")
        return
    if not names or (fault.kind == "leave" and len(names) <= 1):
        return
    name = names[fault.member % len(names)]
    sc = world.sidecars[name]
    if fault.kind in ("gc-pause", "net-cut") and end >= world.cfg.fault_time:
        return  # faults stop at fault_time
    world.count(fault.kind)
    world.trace("fault", f"{fault} on {name}")
    if fault.kind in ("recreate", "impostor"):
        world.gone(sc)
        del world.sidecars[name]
        world.delete_pod(name)
        if fault.kind == "recreate":
            world.kernel.at(world.kernel.now + fault.seconds, world.restart, name)
            return
        world.bare.add(name)
        s = world.spec
        grace = max(s.restart_grace_seconds, s.stateful_set_restart_grace_seconds)
        world.impostor = (world.start_member(name), world.kernel.now + grace)
        return
    if fault.kind == "crash":
        world.gone(sc)
        del world.sidecars[name]
        world.put_pod(name, ready=False)
        back = min(end, max(world.cfg.fault_time, world.kernel.now))
        if fault.same_name:
            world.kernel.at(back, world.restart, name)
        else:
            world.delete_pod(name)
            world.kernel.at(back, world.restart, None)
    elif fault.kind == "gc-pause":
        sc.app_write_all()  # frozen mid-write: these land after the pause
        sc.proc.pause(fault.seconds)
        if fault.seconds > world.spec.lease.duration_seconds:
            world.count("gc-pause>lease")
    elif fault.kind == "lose-answer":
        sc.proc.lose_answers += 1
    elif fault.kind == "net-cut":
        sc.proc.cut_until = max(sc.proc.cut_until, end)
    elif fault.kind == "leave":
        world.put_pod(name, ready=False, terminating=True)  # a pod being deleted
        sc.begin_shutdown()
