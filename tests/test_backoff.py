"""The retry pause (kgroup.core.backoff) and where the member uses it: session starts back
off exponentially, spread, and start over after a success; members that failed together
retry apart; a partition's retries grow to a short bound."""

from __future__ import annotations

import random

import pytest

from kgroup.core.backoff import Backoff, draws
from kgroup.core.locks import LeaseTiming
from kgroup.core.member.pacing import PARTITION_BACKOFF, SESSION_BACKOFF
from kgroup.core.member.reconcile import (
    Member,
    Snapshot,
    StartSession,
    Target,
)

TIMING = LeaseTiming(duration=8.0, renew_interval=2.0, margin=1.0)


def test_the_pause_doubles_to_its_cap_and_is_none_without_failures() -> None:
    b = Backoff(base=0.2, cap=8.0, spread=0.0)
    assert [b.delay(n, 0.5) for n in range(0, 9)] == [
        0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 8.0, 8.0]
    assert b.delay(10_000, 0.5) == 8.0  # no overflow however long it failed


@pytest.mark.parametrize("failures", [1, 3, 12])
def test_the_spread_covers_its_band_and_no_more(failures: int) -> None:
    b = Backoff(base=1.0, cap=8.0, spread=0.25)
    nominal = min(8.0, 2.0 ** (failures - 1))
    assert b.delay(failures, 0.0) == pytest.approx(0.75 * nominal)
    assert b.delay(failures, 0.999999) == pytest.approx(1.25 * nominal, rel=1e-5)
    assert b.delay(failures, 5.0) == pytest.approx(1.25 * nominal)  # a bad draw is clamped
    draws = [b.delay(failures, random.Random(i).random()) for i in range(200)]
    assert 0.75 * nominal <= min(draws) < max(draws) <= 1.25 * nominal
    assert len(set(draws)) == len(draws)


@pytest.mark.parametrize("bad", [dict(base=0.0, cap=1.0), dict(base=2.0, cap=1.0),
                                 dict(base=1.0, cap=2.0, spread=1.0)])
def test_a_nonsense_backoff_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**bad)


def snap(now: float) -> Snapshot:
    return Snapshot(now, TIMING, 5.0, Target(1, frozenset()), {})


def session_retries(m: Member, failures: int) -> list[float]:
    """Fail ``failures`` session starts in a row; the pause before each next start."""
    now, pauses = 0.0, []
    for _ in range(failures):
        assert m.step(snap(now)) == [StartSession(timing=TIMING)]
        m.session_start_failed(now=now)
        wake = m.next_wakeup(snap(now))
        assert wake is not None and wake > now
        assert m.step(snap(wake - 0.01)) == []  # not before its time
        pauses.append(wake - now)
        now = wake
    return pauses


def test_failed_session_starts_back_off_spread_and_start_over_after_a_success() -> None:
    m = Member("pod-a", uid="u1")
    pauses = session_retries(m, 7)
    nominal = [SESSION_BACKOFF.delay(n, 0.5) for n in range(1, 8)]
    assert nominal == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    for pause, nom in zip(pauses, nominal, strict=True):
        assert 0.75 * nom <= pause <= 1.25 * nom
    # a session, then its loss: the next failure waits about a second again
    m.step(snap(100.0))
    m.session_started("S1", sent_at=100.0, timing=TIMING, now=100.0)
    acts = m.step(snap(200.0))  # the deadline passed: fenced, and started again at once
    assert m.session is None and acts[-1] == StartSession(timing=TIMING)
    m.session_start_failed(now=200.0)
    wake = m.next_wakeup(snap(200.0))
    assert wake is not None and 0.75 <= wake - 200.0 <= 1.25


def test_members_that_failed_together_retry_apart() -> None:
    pauses = [session_retries(Member(f"pod-{i}", uid=f"u{i}"), 3) for i in range(20)]
    assert len({p[2] for p in pauses}) == 20  # no two members retry at the same moment
    again = [session_retries(Member(f"pod-{i}", uid=f"u{i}"), 3) for i in range(20)]
    assert again == pauses  # reproducible: seeded by the pod


def test_a_partitions_retries_grow_to_a_short_bound_and_reset_when_it_is_taken() -> None:
    m = Member("pod-a", draw=random.Random(1).random)
    m.step(snap(0.0))
    m.session_started("S1", sent_at=0.0, timing=TIMING, now=0.0)
    retries = []
    for n in range(5):
        m.acquire_failed(3, "S1", now=float(n))
        retries.append(m._retry_at[3] - n)
    assert all(0.75 * PARTITION_BACKOFF.delay(k + 1, 0.5) <= r
               <= 1.25 * PARTITION_BACKOFF.delay(k + 1, 0.5) for k, r in enumerate(retries))
    assert max(retries) <= 2.5
    m.acquired(3, "S1", token=7, resource_version="7")
    m.release_failed(3, "S1", now=10.0, still_ours=True)
    assert 0.75 <= m._retry_at[3] - 10.0 <= 1.25  # counted afresh


def test_both_processes_watches_reconnect_with_one_backoff_and_end_spread() -> None:
    """The sidecar's watches and the operator's Lease watch run one loop
    (kgroup.kube_watch.follow) over kgroup.core.watch_stream's rule."""
    from kgroup.core import watch_stream as ws

    assert ws.RECONNECT.delay(1, 0.5) == 0.2 and ws.RECONNECT.delay(99, 0.5) == 8.0
    ends = {ws.watch_seconds(random.Random(i).random()) for i in range(100)}
    assert min(ends) >= ws.WATCH_SECONDS and max(ends) < 2 * ws.WATCH_SECONDS
    assert len(ends) > 50  # spread, not one moment for every pod started together
    assert ws.watch_seconds(1.0) < 2 * ws.WATCH_SECONDS


def test_a_pods_draws_are_uniform_reproducible_and_its_own() -> None:
    a = draws("pod-a/u1")
    first = [next(a) for _ in range(2000)]
    assert all(0.0 <= x < 1.0 for x in first)
    assert 0.45 < sum(first) / len(first) < 0.55
    assert sum(x < 0.25 for x in first) in range(400, 600)  # each quarter about as often
    b, again = draws("pod-b/u2"), draws("pod-a/u1")
    assert [next(again) for _ in range(2000)] == first
    assert [next(b) for _ in range(10)] != first[:10]
