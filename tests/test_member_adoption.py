"""Rule 2's adoption (kgroup.core.member.reconcile): an acquisition reported failed that the server
applied after all is adopted when the lock shows exactly that write; a lock merely seen
with our session (a lagging view of one we released) is not."""

from __future__ import annotations

from test_member import ME, World, joined, of

from kgroup.core.member.reconcile import Acquire, Adopted, Release, Revoke, Target


def test_an_acquisition_reported_failed_but_applied_is_adopted() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    [a] = of(m.step(w.snap(0.1)), Acquire)
    m.acquire_failed(0, "S1", now=0.5)  # no answer; the re-read came before the write
    w.set_lock(0, ME, "S1", a.token, position="17")  # ...which is applied afterwards
    acts = m.step(w.snap(0.6))
    assert of(acts, Adopted) == [Adopted(0, "S1", a.token, "17")]
    assert [(p.partition, p.token, p.state) for p in m.view(0.6).partitions] == [
        (0, a.token, "active")]


def test_an_adopted_lock_no_longer_targeted_is_revoked() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    [a] = of(m.step(w.snap(0.1)), Acquire)
    m.acquire_failed(0, "S1", now=0.5)
    w.target = Target(2, frozenset())
    w.set_lock(0, ME, "S1", a.token)
    acts = m.step(w.snap(0.6))
    assert of(acts, Adopted) and [r.partition for r in of(acts, Revoke)] == [0]


def test_a_lock_seen_with_our_session_after_we_released_it_is_not_adopted() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    [a] = of(m.step(w.snap(0.1)), Acquire)
    w.set_lock(0, ME, "S1", a.token)
    m.acquired(0, "S1", token=a.token, resource_version=w.locks[0].resource_version)
    w.target = Target(2, frozenset())
    m.step(w.snap(0.2))
    m.step(w.snap(10.0))  # drain timeout: release
    m.released(0, "S1")
    w.target = Target(3, frozenset({0}))  # targeted again; the view still shows our write
    acts = m.step(w.snap(10.1))
    assert of(acts, Adopted) == [] and m.view(10.1).partitions == ()
    assert of(acts, Release) == []


def test_another_write_over_a_failed_acquisition_ends_the_wait_for_it() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    [a] = of(m.step(w.snap(0.1)), Acquire)
    m.acquire_failed(0, "S1", now=0.5)
    w.set_lock(0, "pod-b", "T", a.token)  # someone else's write won
    m.step(w.snap(0.6))
    w.set_lock(0, ME, "S1", a.token)  # cannot be ours any more: ignored, not adopted
    assert of(m.step(w.snap(0.7)), Adopted) == []
