"""The operator's lock writes as request chains (kgroup.core.operator.lock_requests): the
sequencing both drivers perform, driven here by hand, one answer at a time: the expiry
marks, the assignment marks, the creates of missing locks."""

from __future__ import annotations

from kgroup.core.lease_codec import new_partition_lease
from kgroup.core.operator.decide import Memory
from kgroup.core.operator.failure_detector import ExpiryRule, expiry_chains
from kgroup.core.operator.lock_creation import creation_chains
from kgroup.core.operator.lock_requests import (
    Answer,
    Chain,
    CreateLease,
    Lane,
    LockRequest,
    MarkExpired,
    NoAnswer,
    Ok,
    ReadLease,
    Refused,
    Then,
)
from tests.test_operator_logic import Op, held_lease, member_lease, partition_lease


def step(chain: Chain, answer: Answer | None) -> LockRequest | Then:
    try:
        return chain.send(answer)  # type: ignore[arg-type]
    except StopIteration as stop:
        then: Then = stop.value
        return then


def crashed() -> tuple[Op, list[Chain]]:
    """a's session unrenewed a full duration: its two locks' expiries, as chains."""
    op = Op("a")
    op.leases.put(held_lease(0, "40", "a", "s-a"), op.now)
    op.leases.put(held_lease(1, "41", "a", "s-a"), op.now)
    op.now += 15
    expiries = op.decide().expiries
    assert [e.partition for e in expiries] == [0, 1]
    chains = expiry_chains(expiries, group="g", leases=op.leases, rule=ExpiryRule(),
                           ledger=op.memory, clock=lambda: op.now)
    assert sorted(op.memory.expiries_sent) == [0, 1]  # in flight: not decided again
    return op, chains


def test_an_expiry_is_marked_only_after_the_quorum_read_confirms_it() -> None:
    op, chains = crashed()
    assert len(chains) == 1  # one holder session, one quorum read
    (chain,) = chains
    assert step(chain, None) == ReadLease("g-member-a")
    then = step(chain, Ok(member_lease("a", "20")))  # unchanged marker: over
    assert isinstance(then, Then) and len(then.chains) == 2 and not then.decide
    marks = [step(c, None) for c in then.chains]
    assert marks == [MarkExpired("g-partition-0", 0, "s-a", "40"),
                     MarkExpired("g-partition-1", 1, "s-a", "41")]
    # written: the stored lock goes into the cache
    assert step(then.chains[0], Ok(held_lease(0, "50", "a", "s-a", expired="s-a"))) == Then()
    assert op.leases.partitions[0].expired == "s-a"
    # refused (the lock changed): re-read, decide again
    assert step(then.chains[1], Refused(409)) == ReadLease("g-partition-1")
    assert 1 not in op.memory.expiries_sent
    assert step(then.chains[1], Ok(held_lease(1, "52", "b", "s-b"))) == Then(decide=True)
    assert op.leases.partitions[1].holder == "b"


def test_a_renewal_the_quorum_read_shows_saves_the_holder() -> None:
    op, (chain,) = crashed()
    step(chain, None)
    then = step(chain, Ok(member_lease("a", "35")))  # renewed since the watch's view
    assert isinstance(then, Then) and then.decide and not then.chains
    assert op.memory.expiries_sent == {}


def test_a_read_without_answer_fails_the_expiries_and_retries() -> None:
    op, (chain,) = crashed()
    step(chain, None)
    assert step(chain, NoAnswer("timeout")) == Then(retry=True)
    assert op.memory.expiries_sent == {}


def test_a_chain_closed_unfinished_reports_its_expiries_failed() -> None:
    op, (chain,) = crashed()
    step(chain, None)
    chain.close()
    assert op.memory.expiries_sent == {}


def test_without_the_reread_the_rule_decides_on_the_cache_alone() -> None:
    class NoReread(ExpiryRule):
        def reread(self) -> bool:
            return False

    op = Op("a")
    op.leases.put(held_lease(0, "40", "a", "s-a"), op.now)
    op.now += 15
    (chain,) = expiry_chains(op.decide().expiries, group="g", leases=op.leases,
                             rule=NoReread(), ledger=Memory(started_at=0.0),
                             clock=lambda: op.now)
    then = step(chain, None)
    assert isinstance(then, Then) and len(then.chains) == 1


def marked() -> tuple[Op, list[Chain]]:
    """a's first target: the marks of its locks, as chains."""
    from kgroup.core.operator.assignment_marks import mark_chains
    from tests.test_operator_logic import partition_lease

    op = Op("a")
    for p in range(4):
        op.leases.put(partition_lease(p, str(40 + p)), op.now)
    plan = op.decide()
    op.write(plan, "11")
    assert [m.partition for m in plan.marks] == [0, 1, 2, 3]
    chains = mark_chains(plan.marks, group="g", leases=op.leases, memory=op.memory,
                         clock=lambda: op.now)
    assert sorted(op.memory.marks_sent) == [0, 1, 2, 3]
    return op, chains


def test_a_mark_refused_re_reads_the_lock_and_decides_again() -> None:
    from kgroup.core.operator.lock_requests import MarkAssigned

    op, chains = marked()
    request = step(chains[0], None)
    assert isinstance(request, MarkAssigned) and request.name == "g-partition-0"
    assert request.wanted()
    assert step(chains[0], Refused(409)) == ReadLease("g-partition-0", Lane.MARK)
    assert 0 not in op.memory.marks_sent
    assert step(chains[0], Ok(held_lease(0, "45", "a", "s-a"))) == Then(decide=True)
    assert op.leases.partitions[0].resource_version == "45"


def test_a_mark_superseded_before_its_turn_is_dropped_unsent() -> None:
    from kgroup.core.operator.lock_requests import MarkAssigned, Superseded

    op, chains = marked()
    request = step(chains[1], None)
    assert isinstance(request, MarkAssigned)
    op.leases.put(held_lease(1, "50", "b", "s-b"), op.now)  # the lock moved on
    assert not request.wanted()
    assert step(chains[1], Superseded()) == Then(decide=True)
    assert 1 not in op.memory.marks_sent
    request = step(chains[2], None)
    op.memory.marks_sent[2] = ("b", None, "42")  # a later pass's mark replaced it
    assert step(chains[2], Superseded()) == Then()
    assert op.memory.marks_sent[2] == ("b", None, "42")
    step(chains[3], None)
    assert step(chains[3], NoAnswer("timeout")) == Then(retry=True)
    assert 3 not in op.memory.marks_sent


# ---- the creates of missing locks (kgroup.core.operator.lock_creation) ----------------------


def creating() -> tuple[Op, list[Chain]]:
    """a's first pass: its four locks' creates, as chains."""
    op = Op("a")
    plan = op.decide()
    assert plan.create_partitions == [0, 1, 2, 3]
    chains = creation_chains(plan.create_partitions, group=op.body, namespace="ns",
                             duration=plan.lease_duration, owners=plan.owners,
                             uids={"a": "uid-a"}, ledger=op.memory, now=op.now)
    assert op.memory.requested_leases == dict.fromkeys(range(4), op.now)  # in flight
    return op, chains


def test_a_create_sends_the_codec_s_lock_marked_for_its_owner_and_is_not_asked_again(
) -> None:
    op, chains = creating()
    op.memory.squatted[2] = "taken before"
    request = step(chains[2], None)
    assert request == CreateLease("g-partition-2", 2, new_partition_lease(
        namespace="ns", group=op.body, partition=2, duration=15, assigned="a",
        assigned_uid="uid-a"))
    assert op.decide().create_partitions == []  # still in flight: not asked again
    assert step(chains[2], Ok(partition_lease(2, "42"))) == Then()
    assert 2 not in op.memory.squatted  # created: the name is free again
    op.now += 1.0
    assert 2 not in op.decide().create_partitions  # answered, the watch not there yet


def test_a_create_refused_409_reads_the_name_back_and_a_squatter_degrades_the_group(
) -> None:
    op, chains = creating()
    step(chains[2], None)
    assert step(chains[2], Refused(409)) == ReadLease("g-partition-2", Lane.CREATE)
    squat = {"metadata": {"name": "g-partition-2", "labels": {"app": "something-else"}}}
    assert step(chains[2], Ok(squat)) == Then()
    assert "g-partition-2 (partition 2's lock) is taken" in op.memory.squatted[2]
    for p in (0, 1, 3):
        op.leases.put(partition_lease(p, str(40 + p)), op.now)
    op.now += 6.0
    degraded = op.decide()
    assert degraded.create_partitions == []  # a squatted name: every 30 s, not 5
    assert degraded.status is not None and degraded.status["phase"] == "Degraded"
    assert any(c.get("reason") == "LeaseNameTaken" for c in degraded.status["conditions"])


def test_a_create_refused_409_by_this_group_s_own_lock_is_no_squatter() -> None:
    op, chains = creating()
    op.memory.squatted[3] = "taken before"
    step(chains[3], None)
    assert step(chains[3], Refused(409)) == ReadLease("g-partition-3", Lane.CREATE)
    assert step(chains[3], Ok(partition_lease(3, "43"))) == Then()
    assert 3 not in op.memory.squatted and op.memory.requested_leases[3] == op.now


def test_a_create_refused_or_not_answered_is_asked_again_after_the_retry_pause() -> None:
    op, chains = creating()
    step(chains[0], None)
    assert step(chains[0], NoAnswer("timeout")) == Then(retry=True)
    step(chains[1], None)
    assert step(chains[1], Refused(403)) == Then(retry=True)
    step(chains[2], None)
    step(chains[2], Refused(409))
    assert step(chains[2], NoAnswer("timeout")) == Then(retry=True)  # the read back
    assert sorted(op.memory.requested_leases) == [3]
    assert op.decide().create_partitions == [0, 1, 2]


def test_a_create_chain_closed_unfinished_drops_only_its_own_create() -> None:
    op, chains = creating()
    step(chains[0], None)
    chains[0].close()
    assert 0 not in op.memory.requested_leases
    step(chains[1], None)
    op.memory.create_sent(1, op.now + 5.0)  # a later pass asked again meanwhile
    chains[1].close()
    assert op.memory.requested_leases[1] == op.now + 5.0
