"""Hand edits of the stored objects, and the garbage collector they set off.

What an admin (or a restore from a backup) does to the store behind kgroup's back:
``mark-edit`` (every lock's assignment mark garbled), ``status-reset`` (the group's status
emptied, the operator restarted ``seconds`` later), ``spec-change`` (``member`` more
partitions, a new generation), ``lock-deleted`` (partition ``member``'s Lease deleted) and
``group-reapplied`` (the ConsumerGroup deleted, the garbage collector deleting the Leases
it owned, the same group applied again ``seconds`` later: a new uid, an empty status).

The random draws come in a fixed order: another order would change every pinned seed's run
(scripts/sim_trace_hashes.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kgroup.constants import partition_lease_name
from kgroup.core import lease_codec as codec
from kgroup.core.objects import Obj
from kgroup_sim.control import GROUP_KEY
from kgroup_sim.sidecar import GROUP
from kgroup_sim.store import lease_key

if TYPE_CHECKING:
    from kgroup_sim.faults import Fault
    from kgroup_sim.world import World

HAND_EDIT_KINDS = ("lock-deleted", "group-reapplied")
"""Hand edits an admin may make, drawn at random only when named in ``SimConfig.kinds``
(not in FAULT_KINDS: adding kinds to the draw would change every pinned seed's run)."""
EDIT_KINDS = frozenset({"mark-edit", "status-reset", "spec-change", *HAND_EDIT_KINDS})
"""Every kind :func:`inject_edit` makes (the others are scripted only)."""


def inject_edit(world: World, fault: Fault) -> None:
    """Make the hand edit ``fault.kind`` (one of :data:`EDIT_KINDS`) now."""
    if fault.kind == "status-reset":
        assert world.operator_proc is not None
        world.count(fault.kind)
        world.trace("fault", fault)
        group = world.store.get(GROUP_KEY)
        assert group is not None
        world.store.update(GROUP_KEY, {**group, "status": {}})
        world.operator_proc.crash()
        world.kernel.after(fault.seconds, world.start_operator)
        return
    if fault.kind == "mark-edit":  # an admin garbles every lock's assignment mark
        world.count(fault.kind)
        world.trace("fault", fault)
        for p in range(world.spec.partitions):
            key = lease_key(partition_lease_name(GROUP, p))
            if (body := world.store.get(key)) is not None:
                world.store.update(key, codec.marked_partition_lease(body, "mallory"))
        return
    if fault.kind == "spec-change":
        world.count(fault.kind)
        world.trace("fault", fault)
        group = world.store.get(GROUP_KEY)
        assert group is not None
        world.spec = world.spec.model_copy(
            update={"partitions": world.spec.partitions + fault.member})
        md = {**group["metadata"], "generation": group["metadata"]["generation"] + 1}
        world.store.update(GROUP_KEY, {**group, "metadata": md, "spec": world.spec.to_wire()})
        return
    if fault.kind == "lock-deleted":
        key = lease_key(partition_lease_name(GROUP, fault.member % world.spec.partitions))
        obj = world.store.get(key)
        if obj is not None:
            world.count(fault.kind)
            world.trace("fault", fault)
            delete_lease(world, key, obj)
        return
    if fault.kind == "group-reapplied":
        group = world.store.get(GROUP_KEY)
        if group is None:
            return  # deleted already, applied again later
        world.count(fault.kind)
        world.trace("fault", fault)
        world.store.delete(GROUP_KEY)
        world.kernel.after(world.rng.uniform(0.0, 1.0), collect_garbage, world)
        applied = {k: v for k, v in group.items() if k != "status"}
        applied["metadata"] = {k: v for k, v in group["metadata"].items()
                               if k in ("name", "namespace", "generation")}
        world.kernel.after(fault.seconds, apply_group, world, {**applied, "status": {}})
        return
    raise ValueError(f"not a hand edit: {fault.kind!r}")


def collect_garbage(world: World) -> None:
    """The garbage collector: every Lease whose owner (the group) is gone."""
    group = world.store.get(GROUP_KEY)
    uid = codec.meta(group).get("uid") if group is not None else None
    for key, obj in world.store.list("leases"):
        owners = {ref.get("uid") for ref in codec.meta(obj).get("ownerReferences") or []}
        if owners and uid not in owners:
            delete_lease(world, key, obj)


def delete_lease(world: World, key: str, obj: Obj) -> None:
    """A Lease deleted by hand or by the garbage collector: a partition lock's token is
    revoked (its holder may claim it until it sees the deletion)."""
    lock = codec.parse_partition_lease(obj).value if codec.is_partition(obj) else None
    if lock is not None:
        world.checker.revoke(lock.partition, lock.token, f"{lock.holder}/{lock.session}")
    session = codec.parse_member_lease(obj).value if codec.is_member(obj) else None
    if session is not None:  # its holder's locks are FREE to others from now on
        for held in map(world.lock, range(world.spec.partitions)):
            if held is not None and (held.holder, held.session) == (
                    session.member, session.session):
                world.checker.revoke(held.partition, held.token, f"{held.holder}/{held.session}")
    world.store.delete(key)


def apply_group(world: World, body: Obj) -> None:
    """kubectl apply of the group deleted earlier: a new object (uid)."""
    if world.store.get(GROUP_KEY) is None:
        world.store.create(GROUP_KEY, body)
    world.kernel.after(world.rng.uniform(0.5, 2.0), collect_garbage, world)
