"""Retention: which Leases of retired partitions the operator deletes.

A generation leaves the lineage when every partition it does not hand on is read to its
end (``Lineage.retire``, docs/reshape.md "Retirement"). ``nextPartition`` stays, so a
retired number is never issued again: its Lease serves no one, and without this it stays
in the namespace for good. :func:`retired_leases` names the Leases to delete; the
operator's driver deletes each one conditional on the resourceVersion (and uid) read here,
so a Lease that changed since is not deleted (409) and is decided on again as it is now.

The rule, every condition needed (each has its own test in
``tests/test_operator_retention.py``):

1. the lineage is the one ``status.layout`` holds as the server stored it (decoded from
   the group's body as read), not the one this pass derives: the derivation may retire a
   generation the status does not say yet, and a status without a layout, or with one that
   does not decode, says nothing (nothing is deleted);
2. the Lease is this group's lock of partition ``p``: named
   ``partition_lease_name(group, p)`` and labelled as that group's lock of ``p``;
3. ``p`` is retired: below ``nextPartition`` (issued) and in no generation the lineage
   keeps (a number at or above ``nextPartition`` is one the lineage never issued: not
   ours to judge);
4. the Lease has no holder (``spec.holderIdentity`` empty);
5. the Lease records its completion (``lease_codec.completed_token``: the sidecar's
   completed release wrote ``kgroup.dev/completed`` equal to ``kgroup.dev/position-token``).

The chart's policy (``admission-policy-operator.yaml``) checks 2, 4 and 5 again on the API
server for the operator's service account; 1 and 3 need the group's status, which a
ValidatingAdmissionPolicy cannot read. Streams and sink records are not touched: the data's
owner deletes them (docs/reshape.md, "Retention").

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kgroup import constants as C
from kgroup.core.lease_codec import completed_token, labels_of, meta
from kgroup.core.lineage import Lineage
from kgroup.core.objects import Obj
from kgroup.core.operator.lock_requests import (
    Chain,
    DeleteLease,
    NoAnswer,
    Ok,
    Refused,
    Then,
)

__all__ = ["Deletion", "DeletionLedger", "deletion_chains", "retired_leases"]


@dataclass(frozen=True)
class Deletion:
    """Delete Lease ``name`` (partition ``partition``'s lock), only while it is still at
    ``seen_rv`` (and is the object of ``uid``, when known)."""

    partition: int
    name: str
    seen_rv: str
    uid: str | None = None


def retired_leases(lineage: Lineage | None, bodies: Mapping[str, Obj], group: str,
                   partitions: Iterable[int],
                   sent: Mapping[int, str] | None = None) -> list[Deletion]:
    """The Leases to delete, ascending by partition: ``lineage`` is the lineage
    ``status.layout`` holds as stored (None: absent or not decodable), ``bodies`` the
    group's Leases by name, ``partitions`` the partition numbers of the locks cached,
    ``sent``: partition -> the resourceVersion a delete is already on its way for (not
    asked again for that version)."""
    if lineage is None:
        return []
    kept, issued = lineage.partitions, lineage.next_partition
    if len(kept) == issued:  # every number issued is still kept: nothing retired
        return []
    out: list[Deletion] = []
    for p in sorted(q for q in partitions if q < issued and q not in kept):
        name = C.partition_lease_name(group, p)
        body = bodies.get(name)
        if body is None or not _lock_of(body, group, p):
            continue
        if (body.get("spec") or {}).get("holderIdentity"):
            continue
        if completed_token(body) is None:
            continue
        md = meta(body)
        rv = str(md.get("resourceVersion") or "")
        if not rv or (sent or {}).get(p) == rv:
            continue
        uid = md.get("uid")
        out.append(Deletion(p, name, rv, str(uid) if uid else None))
    return out


def _lock_of(body: Obj, group: str, partition: int) -> bool:
    labels = labels_of(body)
    return (labels.get(C.LABEL_GROUP) == group and labels.get(C.LABEL_ROLE) == C.ROLE_PARTITION
            and labels.get(C.LABEL_PARTITION) == str(partition))


class DeletionLedger(Protocol):
    """Where deletes in flight are kept (the operator's ``Memory``)."""

    def deletion_sent(self, deletion: Deletion) -> None: ...

    def deletion_failed(self, deletion: Deletion) -> None: ...


def deletion_chains(deletions: list[Deletion], *, ledger: DeletionLedger,
                    gone: Callable[[Deletion], None] = lambda d: None) -> list[Chain]:
    """The pass's deletes as request chains, each reported in flight to ``ledger`` at once.
    Done: ``gone`` (the driver drops it from its cache). Refused as forbidden (403: RBAC
    or the chart's policy, an older chart): kept as sent, so it is not asked again until
    the Lease changes (or the operator restarts), never retried in a loop. Refused
    otherwise (the Lease changed since it was read, or is gone): the group decided again
    on it as it is now. No answer: decided again after the API server's retry pause."""
    for d in deletions:
        ledger.deletion_sent(d)
    return [_delete(d, ledger, gone) for d in deletions]


def _delete(d: Deletion, ledger: DeletionLedger, gone: Callable[[Deletion], None]) -> Chain:
    settled = False
    try:
        answer = yield DeleteLease(d.name, d.partition, d.seen_rv, d.uid)
        settled = True
        if isinstance(answer, Ok):
            gone(d)
            return Then(note=f"deleted Lease {d.name}: partition {d.partition} is retired, "
                             f"read to its end and free")
        if isinstance(answer, Refused) and answer.status == 403:
            return Then(note=f"the delete of Lease {d.name} (partition {d.partition}, "
                             f"retired) was forbidden (403: RBAC or the admission policy); "
                             f"not asked again until the Lease changes")
        ledger.deletion_failed(d)
        if isinstance(answer, NoAnswer):
            return Then(retry=True)
        return Then(decide=True)
    finally:
        if not settled:  # the chain was closed before its answer
            ledger.deletion_failed(d)
