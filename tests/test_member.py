"""The sidecar's state machine (kgroup.core.member.reconcile): one rule per test."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TypeVar

from kgroup.core.locks import LeaseTiming
from kgroup.core.member.pacing import ACQUISITIONS_IN_FLIGHT
from kgroup.core.member.reconcile import (
    AckEpoch,
    Acquire,
    Action,
    AppRelease,
    EndSession,
    Fence,
    Lock,
    Lost,
    Member,
    Release,
    Renew,
    Revoke,
    Snapshot,
    StartSession,
    Target,
)

A = TypeVar("A")
TIMING = LeaseTiming(duration=10, renew_interval=2)  # fencing deadline = sent + 8
ME = "pod-a"


class World:
    """A scripted observation of the cluster around one member."""

    def __init__(self, partitions: int = 4) -> None:
        # resourceVersions as etcd makes them: one global counter, every write above the last
        self.rv = 100
        self.locks: dict[int, Lock] = {
            p: Lock(p, None, None, 0, str(self.rv + p)) for p in range(partitions)
        }
        self.rv += partitions
        self.target: Target | None = Target(1, frozenset())
        self.app: dict[int, AppRelease] = {}
        self.drain = 5.0
        self.marks = True  # the operator marks each targeted lock for its target owner (ME)

    def snap(self, now: float) -> Snapshot:
        locks = dict(self.locks)
        if self.marks and self.target is not None:
            locks = {p: lock if lock.assigned or p not in self.target.partitions
                     else dataclasses.replace(lock, assigned=ME) for p, lock in locks.items()}
        return Snapshot(now, TIMING, self.drain, self.target, locks, dict(self.app))

    def set_lock(self, p: int, holder: str | None, session: str | None, token: int,
                 position: str | None = None, *, rv: int | None = None,
                 expired: str | None = None) -> None:
        """A write of lock ``p`` (a new resourceVersion); ``rv``: an older read instead;
        ``expired``: the operator's expiry mark."""
        if rv is None:
            self.rv += 1
            rv = self.rv
        self.locks[p] = Lock(p, holder, session, token, str(rv), position, expired=expired)


def of(actions: Iterable[Action], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def joined(world: World, now: float = 0.0) -> Member:
    m = Member(ME)
    acts = m.step(world.snap(now))
    assert acts == [StartSession(timing=TIMING)]
    m.session_started("S1", sent_at=now, timing=TIMING, now=now)
    return m


def taken(m: Member, world: World, a: Acquire) -> None:
    """The acquisition ``a`` succeeded: the lock is written, the member told."""
    world.set_lock(a.partition, ME, a.session, a.token)
    m.acquired(a.partition, a.session, token=a.token,
               resource_version=world.locks[a.partition].resource_version)


def acquire_all(m: Member, world: World, now: float) -> None:
    for a in of(m.step(world.snap(now)), Acquire):
        assert isinstance(a, Acquire)
        taken(m, world, a)


def test_no_lock_is_taken_before_the_session_is_confirmed() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    m = Member(ME)
    assert of(m.step(w.snap(0)), Acquire) == []
    assert of(m.step(w.snap(0.5)), StartSession) == []  # already starting


def test_free_targeted_locks_are_acquired_with_their_resource_version_as_token() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    w.set_lock(1, None, None, 6)
    m = joined(w)
    acqs = of(m.step(w.snap(0.1)), Acquire)
    assert [(a.partition, a.token, a.expected_rv) for a in acqs] == [
        (0, 100, "100"), (1, 105, "105")]  # the precondition is the token


def test_acquisitions_in_flight_are_bounded_and_the_next_follow_as_they_end() -> None:
    n = 2 * ACQUISITIONS_IN_FLIGHT + 5
    w = World(partitions=n)
    w.target = Target(1, frozenset(range(n)))
    m = joined(w)
    first = of(m.step(w.snap(0.1)), Acquire)
    assert [a.partition for a in first] == list(range(ACQUISITIONS_IN_FLIGHT))
    assert of(m.step(w.snap(0.2)), Acquire) == []  # none ended: none more
    done = first[:3]  # three end (one taken by another pod: it failed)
    for a in done[:2]:
        taken(m, w, a)
    m.acquire_failed(done[2].partition, done[2].session, now=0.3)
    nxt = of(m.step(w.snap(0.3)), Acquire)
    assert [a.partition for a in nxt] == list(
        range(ACQUISITIONS_IN_FLIGHT, ACQUISITIONS_IN_FLIGHT + 3))
    seen = {a.partition for a in first + nxt}
    for a in first[3:] + nxt:  # the rest of those in flight end
        taken(m, w, a)
    now = 0.4
    while len(m.owned) < n:  # each wave ends before the next step: every one taken once
        now += 0.5  # the failed one is retried after its pause
        acts = of(m.step(w.snap(now)), Acquire)
        assert 0 < len(acts) <= ACQUISITIONS_IN_FLIGHT
        for a in acts:
            assert a.partition not in m.owned
            seen.add(a.partition)
            taken(m, w, a)
    assert seen == set(range(n))


def test_held_lock_waits_for_the_operators_expiry_mark_of_its_session() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    w.set_lock(0, "pod-b", "B1", 3)
    m = joined(w)
    m.step(w.snap(2.0))
    m.renewed("S1", sent_at=7.0, timing=TIMING, epoch=None, now=7.0)
    # however long pod-b looks silent (it was seen at 0, more than a duration ago): no
    # timer of ours makes its lock takeable; the next wake-up is our own renewal
    assert of(m.step(w.snap(8.9)), Acquire) == []
    assert m.next_wakeup(w.snap(8.9)) == 9.0
    w.set_lock(0, "pod-b", "B1", 3, expired="B0")  # a mark of another session: still held
    assert of(m.step(w.snap(8.95)), Acquire) == []
    w.set_lock(0, "pod-b", "B1", 3, expired="B1")  # the operator saw B1 over
    [a] = of(m.step(w.snap(8.97)), Acquire)
    assert isinstance(a, Acquire)
    assert (a.token, a.expected_rv, a.takeover) == (107, "107", True)


def test_lock_held_by_our_own_old_session_is_free_to_us() -> None:
    w = World()
    w.target = Target(1, frozenset({2}))
    w.set_lock(2, ME, "S0", 5)  # no expiry mark: our old session fenced itself
    m = joined(w)
    [a] = of(m.step(w.snap(0.1)), Acquire)
    assert isinstance(a, Acquire)
    assert (a.token, a.takeover) == (105, False)


def test_missing_partition_lease_is_waited_for() -> None:
    w = World(partitions=0)
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    assert of(m.step(w.snap(0.1)), Acquire) == []


def test_epoch_is_acknowledged_only_when_held_equals_target() -> None:
    w = World()
    w.target = Target(3, frozenset({0, 1}))
    m = joined(w)
    acts = m.step(w.snap(0.1))
    assert of(acts, AckEpoch) == []
    for a in of(acts, Acquire):
        assert isinstance(a, Acquire)
        w.set_lock(a.partition, ME, "S1", a.token)
        m.acquired(a.partition, "S1", token=a.token, resource_version="r")
        acts = m.step(w.snap(0.2))
        if a.partition == 0:
            assert of(acts, AckEpoch) == []
    [ack] = of(acts, AckEpoch)
    assert isinstance(ack, AckEpoch) and ack.epoch == 3
    m.renewed("S1", sent_at=0.2, timing=TIMING, epoch=3, now=0.3)
    assert m.view(0.3).acked_epoch == 3


def test_the_acknowledged_partitions_follow_the_written_epoch_not_the_one_in_flight() -> None:
    w = World()
    w.target = Target(3, frozenset({0, 1}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    [ack] = of(m.step(w.snap(0.2)), AckEpoch)
    def acked() -> frozenset[int] | None:  # read anew each time (no narrowing)
        return m.acked_partitions

    assert acked() is None  # sent, not written yet
    m.renewed("S1", sent_at=0.2, timing=TIMING, epoch=ack.epoch, now=0.3)
    assert (m.view(0.3).acked_epoch, acked()) == (3, frozenset({0, 1}))
    # epoch 4 leaves {0, 1} alone (another member joined): acknowledged again, same set
    w.target = Target(4, frozenset({0, 1}))
    [ack] = of(m.step(w.snap(0.4)), AckEpoch)
    assert (ack.epoch, acked()) == (4, frozenset({0, 1}))
    # a fence forgets them: a new session acknowledged nothing yet
    m.step(w.snap(20.0))
    assert acked() is None


def test_empty_target_is_acknowledged_at_once() -> None:
    w = World()
    w.target = Target(2, frozenset())
    m = joined(w)
    [ack] = of(m.step(w.snap(0.1)), AckEpoch)
    assert isinstance(ack, AckEpoch) and ack.epoch == 2


def test_untargeted_partition_is_revoked_then_released_on_app_ack() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.target = Target(2, frozenset({0}))
    acts = m.step(w.snap(1.0))
    assert [(a.partition) for a in of(acts, Revoke)] == [1]
    assert of(acts, Release) == [] and of(acts, AckEpoch) == []
    view = m.view(1.0)
    assert [(p.partition, p.state) for p in view.partitions] == [(0, "active"), (1, "revoking")]
    assert view.partitions[1].revoke_deadline_seconds == 5.0
    w.app[1] = AppRelease(token=101, position="17-0")
    [rel] = of(m.step(w.snap(1.5)), Release)
    assert isinstance(rel, Release)
    assert (rel.partition, rel.token, rel.position, rel.reason) == (1, 101, "17-0", "app")
    assert [p.partition for p in m.view(1.5).partitions] == [0]  # not shown while releasing
    assert of(m.step(w.snap(1.6)), AckEpoch) == []  # still held until released
    m.released(1, "S1")
    w.set_lock(1, None, None, 1)
    [ack] = of(m.step(w.snap(1.7)), AckEpoch)
    assert isinstance(ack, AckEpoch) and ack.epoch == 2


def test_app_ack_with_another_token_is_ignored_and_refused() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    assert m.check_release(0, 99, 0.2) == (409, "token 99 is not the current token 100 of 0")
    refused = m.check_release(3, 100, 0.2)
    assert refused is not None and refused[0] == 404
    assert m.check_release(0, 100, 0.2) is None
    assert m.check_release(0, 100, 8.0) is not None  # past the fencing deadline
    w.target = Target(2, frozenset())
    w.app[0] = AppRelease(token=99, position="x")
    assert of(m.step(w.snap(1.0)), Release) == []


def test_drain_timeout_releases_without_a_position() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.target = Target(2, frozenset())
    m.step(w.snap(1.0))
    m.renewed("S1", sent_at=3.0, timing=TIMING, epoch=None, now=3.0)
    assert m.next_wakeup(w.snap(3.0)) == 5.0
    assert of(m.step(w.snap(5.9)), Release) == []
    [rel] = of(m.step(w.snap(6.0)), Release)
    assert isinstance(rel, Release)
    assert (rel.position, rel.reason) == (None, "drain-timeout")


def test_target_giving_back_a_revoking_partition_makes_it_active_without_release() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.target = Target(2, frozenset())
    m.step(w.snap(1.0))
    w.target = Target(3, frozenset({0}))
    acts = m.step(w.snap(2.0))
    assert of(acts, Release) == [] and of(acts, Acquire) == []
    assert [(p.partition, p.state, p.token) for p in m.view(2.0).partitions] == [(0, "active", 100)]
    [ack] = of(acts, AckEpoch)
    assert isinstance(ack, AckEpoch) and ack.epoch == 3


def test_target_change_while_revoking_keeps_the_drain_clock() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.target = Target(2, frozenset({1}))
    m.step(w.snap(1.0))
    w.target = Target(3, frozenset({1, 2}))
    acts = m.step(w.snap(3.0))
    assert [a.partition for a in of(acts, Acquire)] == [2]
    assert m.view(3.0).partitions[0].revoke_deadline_seconds == 3.0  # since 1.0, not 3.0


def test_stale_observation_older_than_our_write_is_ignored() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    w.set_lock(0, None, None, 4)
    m = joined(w)
    acquire_all(m, w, 0.1)  # token 105 (the precondition), stored at rv 106
    w.set_lock(0, "pod-b", "B1", 4, rv=105)  # an event older than our write
    acts = m.step(w.snap(0.5))
    assert of(acts, Lost) == [] and of(acts, Acquire) == []
    assert [(p.partition, p.token) for p in m.view(0.5).partitions] == [(0, 105)]


def test_lock_taken_by_a_higher_token_is_lost() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.set_lock(0, "pod-b", "B1", 104)
    acts = m.step(w.snap(0.5))
    assert [(a.partition, a.token) for a in of(acts, Lost)] == [(0, 100)]
    assert m.view(0.5).partitions == ()


def test_fencing_empties_the_view_at_the_deadline_then_starts_a_new_session() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    assert len(m.view(7.9).partitions) == 2
    assert 0 < m.view(7.9).valid_for_seconds <= 0.1 + 1e-9
    # a renewal sent at 2.0 is still in flight: no confirmation, no extension
    view = m.view(8.0)
    assert view.fenced and view.partitions == ()  # even before step runs
    acts = m.step(w.snap(9.0))
    assert isinstance(acts[0], Fence)
    assert acts[0].partitions == ((0, 100), (1, 101)) and acts[0].until == 8.0
    assert isinstance(acts[1], StartSession)
    assert of(acts, Acquire) == []
    m.acquired(2, "S1", token=1, resource_version="late")  # old session's late result
    assert m.view(9.0).partitions == ()
    m.session_started("S2", sent_at=9.1, timing=TIMING, now=9.2)
    acqs = of(m.step(w.snap(9.3)), Acquire)
    assert [(a.partition, a.token, a.takeover) for a in acqs] == [
        (0, 105, False), (1, 106, False)]  # the resourceVersions of S1's writes


def test_renewal_confirmed_after_the_deadline_does_not_rescue_the_session() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    renews = of(m.step(w.snap(2.0)), Renew)
    assert len(renews) == 1
    m.renewed("S1", sent_at=2.0, timing=TIMING, epoch=None, now=8.5)  # after deadline 8.0
    assert isinstance(m.step(w.snap(8.5))[0], Fence)


def test_renewal_extends_the_deadline_from_its_send_time() -> None:
    w = World()
    m = joined(w)
    m.step(w.snap(2.0))
    m.renewed("S1", sent_at=2.0, timing=TIMING, epoch=None, now=2.4)
    assert m.deadline == 10.0
    assert not m.view(9.9).fenced


def test_lost_session_fences_at_once() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    m.step(w.snap(2.0))
    m.renew_failed("S1", now=2.1, session_lost=True, retry_in=1.0)
    assert isinstance(m.step(w.snap(2.1))[0], Fence)


def test_renewal_is_due_every_interval_with_one_write_in_flight() -> None:
    w = World()
    w.target = None
    m = joined(w)
    assert of(m.step(w.snap(1.9)), Renew) == []
    assert len(of(m.step(w.snap(2.0)), Renew)) == 1
    assert of(m.step(w.snap(2.5)), Renew) == []


def test_shutdown_revokes_everything_releases_then_ends_the_session() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    m.begin_shutdown()
    assert len(of(m.step(w.snap(0.5)), Revoke)) == 1
    w.app[0] = AppRelease(token=100, position="p")
    [rel] = of(m.step(w.snap(0.6)), Release)
    assert of(m.step(w.snap(0.7)), EndSession) == []
    assert isinstance(rel, Release)
    m.released(0, "S1")
    assert of(m.step(w.snap(0.8)), EndSession) == [EndSession("S1")]


def test_failed_release_still_ours_is_retried_with_the_same_position() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.target = Target(2, frozenset())
    w.app[0] = AppRelease(token=100, position="p9")
    m.step(w.snap(0.5))
    assert len(of(m.step(w.snap(0.5)), Release)) == 0  # in flight
    m.release_failed(0, "S1", now=0.6, still_ours=True)
    w.app.clear()
    assert of(m.step(w.snap(1.3)), Release) == []  # the retry comes 0.75-1.25 s after
    [rel] = of(m.step(w.snap(1.9)), Release)
    assert isinstance(rel, Release) and rel.position == "p9"


def test_next_wakeup_is_never_in_the_past_once_step_has_acted() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    w.set_lock(0, "pod-b", "B1", 3, expired="B1")  # marked expired: takeable
    m = joined(w)
    [a] = of(m.step(w.snap(0.1)), Acquire)
    m.acquire_failed(0, "S1", now=0.2)
    wake = m.next_wakeup(w.snap(0.3))
    assert wake is not None and wake > 0.3
    assert of(m.step(w.snap(wake)), Acquire)
    m.acquired(0, "S1", token=a.token, resource_version="r")
    w.set_lock(0, ME, "S1", a.token)
    m.step(w.snap(1.3))
    wake = m.next_wakeup(w.snap(1.3))
    assert wake is not None and wake > 1.3


def test_shutdown_before_the_group_was_seen_ends_at_once() -> None:
    m = Member(ME)
    m.begin_shutdown()
    assert m.step(Snapshot(0.0, None, 5.0, None, {})) == []
    assert m.done


def test_a_partition_the_app_gives_back_is_not_retaken_until_the_epoch_or_drain_passes() -> None:
    # a stopping app releases what it still holds (it is leaving); its sidecar must not
    # take the lock straight back, or the two ping-pong it until the pod is gone
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.app[0] = AppRelease(token=100, position="9-0")
    [rel] = of(m.step(w.snap(0.5)), Release)
    assert isinstance(rel, Release) and (rel.partition, rel.reason) == (0, "app")
    m.released(0, "S1")
    w.set_lock(0, None, None, 100, position="9-0")
    assert of(m.step(w.snap(0.6)), Acquire) == []  # still targeted, free, but given back
    assert m.next_wakeup(w.snap(0.6)) is not None
    [again] = of(m.step(w.snap(0.5 + w.drain)), Acquire)  # a drain timeout later
    assert isinstance(again, Acquire) and (again.partition, again.token) == (0, 107)


def test_a_new_epoch_lifts_the_hold_on_a_partition_the_app_gave_back() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.app[0] = AppRelease(token=100, position=None)
    of(m.step(w.snap(0.5)), Release)
    m.released(0, "S1")
    w.set_lock(0, None, None, 1)
    assert of(m.step(w.snap(0.6)), Acquire) == []
    w.target = Target(2, frozenset({0}))
    assert [a.partition for a in of(m.step(w.snap(0.7)), Acquire)] == [0]


def test_a_lock_deleted_under_its_holder_is_lost_and_retaken_when_created_again() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    old = m.owned[0].token
    del w.locks[0]  # kubectl delete lease: the watch shows it gone
    acts = m.step(w.snap(0.5))
    assert [(a.partition, a.token) for a in of(acts, Lost)] == [(0, old)]
    assert m.view(0.5).partitions == ()  # the app stops at once
    assert of(acts, Acquire) == []  # nothing to take until the operator creates it again
    w.locks[0] = Lock(0, None, None, 0, str(w.rv + 1))  # created again: a higher version
    [a] = of(m.step(w.snap(0.6)), Acquire)
    assert isinstance(a, Acquire) and a.token > old  # the token did not go back


def test_no_session_is_started_for_a_deleted_group() -> None:
    w = World()
    m = Member(ME)
    gone = Snapshot(0.0, TIMING, 5.0, None, {}, group_deleted=True)
    assert of(m.step(gone), StartSession) == []
    assert of(m.step(w.snap(0.1)), StartSession) == [StartSession(timing=TIMING)]
