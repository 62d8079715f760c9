"""The partition locks a pass creates, as request chains (``kgroup.core.operator.
lock_requests``), without I/O.

A lock is created free (no holder, ``leaseTransitions`` 0), marked for its target owner
and its pod's uid when the pass knows them (``lease_codec.new_partition_lease``: the body
is built here, once, for both drivers). Each create is in flight from the moment it is
handed over (:meth:`CreationLedger.create_sent`): no pass asks for it again until the
cache shows the lock, or until ``LEASE_CREATE_RECHECK`` has passed (a lock deleted before
the watch showed it). Created: reported (:meth:`CreationLedger.lease_created`). Refused
with 409: the name is taken, and the Lease holding it is read back; when it is not this
group's lock of that partition (:func:`squatter`) the group is degraded naming it
(``LeaseNameTaken``) and the create is tried again only every ``SQUAT_RECHECK``.
Refused otherwise, not answered, or the read back not answered: the create is dropped
from the ledger (:meth:`CreationLedger.create_failed`) and the group decided again after
the API server's retry pause. The drivers (``kgroup_operator.controller``,
``kgroup_sim.control``) only perform the requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from kgroup import constants as C
from kgroup.core.lease_codec import meta, new_partition_lease
from kgroup.core.objects import Obj
from kgroup.core.operator.lock_requests import (
    Chain,
    CreateLease,
    Lane,
    Ok,
    ReadLease,
    Refused,
    Then,
)

__all__ = ["CreationLedger", "creation_chains", "squatter"]


class CreationLedger(Protocol):
    """Where creates in flight are kept (the operator's ``Memory``), keyed by partition and
    the moment the create was handed over."""

    def create_sent(self, partition: int, now: float) -> None: ...

    def create_failed(self, partition: int, now: float) -> None: ...

    def lease_created(self, partition: int, now: float, *, existing: Obj | None = None,
                      group: str = "") -> None: ...


def creation_chains(partitions: list[int], *, group: Obj, namespace: str, duration: int,
                    owners: Mapping[int, str], uids: Mapping[str, str],
                    ledger: CreationLedger, now: float) -> list[Chain]:
    """One chain per lock of ``partitions`` (``group``: the ConsumerGroup's body, the
    locks' owner; ``duration``: their ``leaseDurationSeconds``; ``owners``: the target
    owners, whose marks the new locks carry, with their pods' ``uids``), each reported in
    flight to ``ledger`` at ``now`` at once."""
    name = str(meta(group).get("name", ""))
    chains: list[Chain] = []
    for p in partitions:
        owner = owners.get(p)
        body = new_partition_lease(namespace=namespace, group=group, partition=p,
                                   duration=duration, assigned=owner,
                                   assigned_uid=uids.get(owner or ""))
        ledger.create_sent(p, now)
        chains.append(_create(name, p, body, ledger, now))
    return chains


def _create(group: str, partition: int, body: Obj, ledger: CreationLedger,
            now: float) -> Chain:
    settled = False
    try:
        name = str(meta(body)["name"])
        answer = yield CreateLease(name, partition, body)
        if isinstance(answer, Ok):
            settled = True
            ledger.lease_created(partition, now)
            return Then()
        if not (isinstance(answer, Refused) and answer.status == 409):
            return Then(retry=True)
        found = yield ReadLease(name, Lane.CREATE)  # the name is taken: by whom?
        if not isinstance(found, Ok):
            return Then(retry=True)
        settled = True
        # found.obj None: gone again since; created again after the recheck
        ledger.lease_created(partition, now, existing=found.obj, group=group)
        return Then()
    finally:
        if not settled:  # refused, not answered, or the chain was closed
            ledger.create_failed(partition, now)


def squatter(existing: Obj, group: str, partition: int) -> str | None:
    """Why ``existing`` (the Lease holding the name of ``group``'s lock of ``partition``)
    is not that lock, or None when it is (labelled kgroup's partition ``partition`` of
    ``group``)."""
    md = meta(existing)
    labels = md.get("labels") or {}
    mine = {C.LABEL_GROUP: group, C.LABEL_ROLE: C.ROLE_PARTITION,
            C.LABEL_PARTITION: str(partition)}
    wrong = {k: labels.get(k) for k, v in mine.items() if labels.get(k) != v}
    if not wrong:
        return None
    said = ", ".join(f"{k}={v!r}" for k, v in sorted(wrong.items()))
    return (f"Lease {str(md.get('name', ''))[:253]} (partition {partition}'s lock) is taken by "
            f"an object that is not this group's lock ({said}); delete or rename it")
