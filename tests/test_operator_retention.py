"""Retention (kgroup.core.operator.retention): which retired partitions' Leases the operator
deletes, and the request chains that delete them. Pure: lineages and Lease bodies in,
deletes out. Each condition of the rule has a test that fails without it; the operator's
pass (``decide``) is checked to hand them over on the lineage the status holds as stored.
On the real API server: e2e/tests/test_reshape_operator.py (the deletes) and
e2e/tests/test_admission_privilege.py (the chart's policy)."""

from __future__ import annotations

from typing import Any

from test_operator_logic import Op

from kgroup.core import lease_codec
from kgroup.core.layout_status import layout_to_status
from kgroup.core.lineage import Lineage, Uniform, initial
from kgroup.core.operator.lock_requests import (
    DeleteLease,
    NoAnswer,
    Ok,
    Refused,
    Then,
)
from kgroup.core.operator.retention import Deletion, deletion_chains, retired_leases

Obj = dict[str, Any]


def shrunk() -> Lineage:
    """4 (modulo) -> 2 (ranges 4-5): generation 1 sealed, nothing completed yet."""
    return initial(4).reshape(Uniform(2))


def retired() -> Lineage:
    """4 -> 2 with 0-3 read to their end: generation 1 retired, 4-5 kept, next 6."""
    lineage = shrunk()
    for p in range(4):
        lineage = lineage.complete(p)
    lineage = lineage.retire()
    assert lineage.partitions == {4, 5} and lineage.next_partition == 6
    return lineage


def lock(p: int, rv: str = "", *, group: str = "g", holder: str | None = None,
         completed: bool = True, labels: dict[str, str] | None = None) -> Obj:
    """Partition ``p``'s lock after its holder's release (with ``completed``: the release
    that records the partition read to its seal), then held by ``holder``, if any."""
    body: Obj = {"metadata": {
        "name": f"{group}-partition-{p}", "resourceVersion": rv or str(100 + p),
        "uid": f"uid-{p}",
        "labels": labels if labels is not None else {
            "kgroup.dev/group": group, "kgroup.dev/role": "partition",
            "kgroup.dev/partition": str(p)},
        "annotations": {"kgroup.dev/session": "s", "kgroup.dev/token": "7"}},
        "spec": {"holderIdentity": "w-0", "leaseTransitions": 1}}
    body = lease_codec.released_partition_lease(body, token=7, position=f"seal-{p}",
                                                completed=completed)
    if holder is not None:
        body["spec"]["holderIdentity"] = holder
    return body


def by_name(*bodies: Obj) -> dict[str, Obj]:
    return {b["metadata"]["name"]: b for b in bodies}


def deleted(lineage: Lineage | None, *bodies: Obj, sent: dict[int, str] | None = None,
            group: str = "g") -> list[int]:
    parts = [int(b["metadata"]["labels"].get("kgroup.dev/partition", "-1")) for b in bodies]
    return [d.partition for d in retired_leases(lineage, by_name(*bodies), group, parts, sent)]


# ---- the rule -----------------------------------------------------------------------------


def test_a_retired_partitions_free_completed_lease_is_deleted_at_the_version_read() -> None:
    got = retired_leases(retired(), by_name(lock(0, "41"), lock(4), lock(5, holder="w-1")),
                         "g", [0, 4, 5])
    assert got == [Deletion(0, "g-partition-0", "41", "uid-0")]


def test_every_retired_lease_goes_and_no_kept_one() -> None:
    assert deleted(retired(), *(lock(p) for p in range(6))) == [0, 1, 2, 3]


def test_nothing_is_deleted_without_a_lineage_in_the_status() -> None:
    assert deleted(None, *(lock(p) for p in range(4))) == []


def test_a_completed_partition_of_a_kept_generation_keeps_its_lease() -> None:
    # 0-2 completed, 3 not: generation 1 is kept, and with it 0-2's numbers
    lineage = shrunk().complete(0).complete(1).complete(2).retire()
    assert 0 in lineage.partitions and lineage.next_partition == 6
    assert deleted(lineage, lock(0), lock(1), lock(2)) == []
    # then 2 -> 4 with 4 completed and 5 not: generation 2 is kept, generation 1 retired
    later = retired().reshape(Uniform(4)).complete(4).retire()
    assert later.partitions == {4, 5, 6, 7, 8, 9}
    assert deleted(later, lock(0), lock(4)) == [0]


def test_a_number_the_lineage_never_issued_keeps_its_lease() -> None:
    # partition 6 is at nextPartition: no generation ever had it, so it is not retired
    assert deleted(retired(), lock(6), lock(9)) == []


def test_a_held_lease_is_kept() -> None:
    assert deleted(retired(), lock(1, holder="w-1")) == []


def test_a_lease_that_records_no_completion_is_kept() -> None:
    assert deleted(retired(), lock(1, completed=False)) == []
    later = lock(2)  # completed, then a later release wrote another position
    later["metadata"]["annotations"]["kgroup.dev/position-token"] = "9"
    assert deleted(retired(), later) == []


def test_a_lease_that_is_not_this_groups_lock_of_the_partition_is_kept() -> None:
    other = lock(1, labels={"kgroup.dev/group": "h", "kgroup.dev/role": "partition",
                            "kgroup.dev/partition": "1"})
    renumbered = lock(2, labels={"kgroup.dev/group": "g", "kgroup.dev/role": "partition",
                                 "kgroup.dev/partition": "2"})
    renumbered["metadata"]["labels"]["kgroup.dev/role"] = "member"
    assert deleted(retired(), other, renumbered) == []


def test_a_lease_under_another_name_is_not_found_so_not_deleted() -> None:
    body = lock(3)
    body["metadata"]["name"] = "g-partition-3-copy"
    assert retired_leases(retired(), by_name(body), "g", [3]) == []


def test_a_delete_in_flight_is_not_asked_again_for_the_same_version() -> None:
    assert deleted(retired(), lock(0, "41"), lock(1, "42"), sent={0: "41", 1: "40"}) == [1]


# ---- the request chains -------------------------------------------------------------------


class Ledger:
    def __init__(self) -> None:
        self.sent: dict[int, str] = {}
        self.failed: list[int] = []

    def deletion_sent(self, d: Deletion) -> None:
        self.sent[d.partition] = d.seen_rv

    def deletion_failed(self, d: Deletion) -> None:
        self.failed.append(d.partition)
        self.sent.pop(d.partition, None)


def run(answer: Any) -> tuple[Then, Ledger, list[int], DeleteLease]:
    ledger, gone = Ledger(), []
    d = Deletion(3, "g-partition-3", "41", "uid-3")
    (chain,) = deletion_chains([d], ledger=ledger, gone=lambda x: gone.append(x.partition))
    assert ledger.sent == {3: "41"}  # in flight from the moment it is handed over
    request = next(chain)
    assert isinstance(request, DeleteLease)
    try:
        chain.send(answer)
    except StopIteration as stop:
        return stop.value, ledger, gone, request
    raise AssertionError("the chain asked for more")


def test_a_delete_is_one_request_with_the_version_and_uid_read() -> None:
    then, ledger, gone, request = run(Ok())
    assert request == DeleteLease("g-partition-3", 3, "41", "uid-3")
    assert gone == [3] and ledger.failed == [] and ledger.sent == {3: "41"}
    assert not then.decide and not then.retry and "retired" in then.note


def test_a_refused_delete_decides_again() -> None:
    then, ledger, gone, _ = run(Refused(409))
    assert then.decide and gone == [] and ledger.failed == [3] and ledger.sent == {}


def test_a_forbidden_delete_is_not_asked_again_until_the_lease_changes() -> None:
    then, ledger, gone, _ = run(Refused(403))
    assert not then.decide and not then.retry and "forbidden" in then.note
    assert gone == [] and ledger.failed == [] and ledger.sent == {3: "41"}


def test_an_unanswered_delete_decides_again_after_the_retry_pause() -> None:
    then, ledger, gone, _ = run(NoAnswer("timeout"))
    assert then.retry and gone == [] and ledger.failed == [3]


def test_a_chain_closed_before_its_answer_forgets_the_delete() -> None:
    ledger = Ledger()
    (chain,) = deletion_chains([Deletion(3, "g-partition-3", "41")], ledger=ledger)
    next(chain)
    chain.close()
    assert ledger.failed == [3] and ledger.sent == {}


# ---- the operator's pass ------------------------------------------------------------------


def test_the_pass_deletes_by_the_lineage_the_status_holds_and_not_twice() -> None:
    op = Op("a")
    for p in range(4):
        op.leases.put(lock(p), op.now)
    op.body = {**op.body, "spec": {**op.body["spec"], "partitions": 2}}
    # no layout in the status (read as one modulo generation of 2): nothing is deleted
    assert op.decide().deletions == []
    op.body = {**op.body, "status": {"layout": layout_to_status(retired())}}
    plan = op.decide()
    assert [d.partition for d in plan.deletions] == [0, 1, 2, 3]
    for d in plan.deletions:
        op.memory.deletion_sent(d)
    assert op.decide().deletions == []  # in flight: not again
    op.leases.drop(lock(0))  # the watch shows 0 gone
    op.leases.put(lock(1, "150", holder="w-0"), op.now)  # 1 taken again meanwhile
    assert op.decide().deletions == []
    assert op.memory.deletions_sent == {2: "102", 3: "103"}  # 0 and 1 forgotten
