"""The operator's leader election decided in the core (kgroup.core.operator.leader_election), on a
clock the test moves: the exact API calls of each case, as client-go's leaderelection tests
count them (one read per attempt, then at most one write). The same cases against the real
API server, counted at the Kubernetes client: e2e/tests/test_leader_lease_calls.py."""

from __future__ import annotations

from kgroup.core.operator.leader_election import Attempt, Election, LeaderLease, Write

DURATION = 15.0


def calls(election: Election, lease: LeaderLease | None, now: float) -> list[str]:
    """What one attempt asks of the API server: the read, then the decided write."""
    attempt = election.after_read(lease, now)
    return ["read"] + ([] if attempt.write is Write.NONE else [attempt.write.value])


def held(by: str, renewed: str, transitions: int = 1) -> LeaderLease:
    return LeaderLease(holder=by, renew_time=renewed, duration=DURATION, transitions=transitions)


def test_no_lease_is_created_with_one_read_and_one_create() -> None:
    election = Election("a", DURATION)
    assert calls(election, None, now=0.0) == ["read", "create"]
    assert election.after_read(None, 0.0) == Attempt(Write.CREATE, 0)


def test_a_free_lease_is_taken_at_once_with_one_replace() -> None:
    election = Election("a", DURATION)
    free = LeaderLease(holder=None, renew_time=None, duration=DURATION, transitions=4)
    assert calls(election, free, now=0.0) == ["read", "replace"]
    assert election.after_read(free, 0.0).transitions == 5


def test_our_own_lease_is_replaced_without_a_transition() -> None:
    election = Election("a", DURATION)
    assert election.after_read(held("a", "t0", transitions=3), 0.0) == Attempt(Write.REPLACE, 3)


def test_a_live_leader_costs_a_standby_one_read_per_attempt_and_no_write() -> None:
    election = Election("b", DURATION)
    # renewed between every attempt: never taken, however long the standby waits
    assert [calls(election, held("a", f"t{i}"), now=i * 5.0) for i in range(10)] == [
        ["read"]] * 10


def test_an_unrenewed_leader_is_taken_after_a_full_duration_on_the_standbys_clock() -> None:
    election = Election("b", DURATION)
    stale = held("a", "t0", transitions=2)
    # first sight starts the standby's clock, whatever the renewTime says
    assert calls(election, stale, now=100.0) == ["read"]
    assert calls(election, stale, now=100.0 + DURATION - 0.01) == ["read"]
    assert calls(election, stale, now=100.0 + DURATION) == ["read", "replace"]
    assert election.after_read(stale, 100.0 + DURATION).transitions == 3


def test_a_new_holder_restarts_the_standbys_clock() -> None:
    election = Election("c", DURATION)
    assert calls(election, held("a", "t0"), now=0.0) == ["read"]
    # b took it with the same renewTime string: another session, a fresh duration
    assert calls(election, held("b", "t0"), now=DURATION) == ["read"]
    assert calls(election, held("b", "t0"), now=2 * DURATION) == ["read", "replace"]


def test_the_leader_stops_when_no_renewal_succeeded_within_two_thirds() -> None:
    election = Election("a", DURATION)
    election.acquired(0.0)
    assert election.retry_interval == DURATION / 3
    assert not election.must_stop(DURATION * 2 / 3)
    election.renewed(DURATION * 2 / 3)
    assert not election.must_stop(DURATION * 4 / 3)
    assert election.must_stop(DURATION * 4 / 3 + 0.01)


def test_a_replica_that_never_led_never_stops() -> None:
    assert not Election("a", DURATION).must_stop(1e9)
