"""Lock rules: session tracking on the observer's clock, lock state, fencing deadline."""

from __future__ import annotations

import pytest

from kgroup.core.locks import (
    LeaseTiming,
    LockState,
    SessionTracker,
    fencing_deadline,
    lock_state,
)


def test_first_sight_starts_the_clock() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv1", 10.0, now=100.0)
    assert t.is_live("a", "s1", 109.9)
    assert not t.is_live("a", "s1", 110.0)


def test_unchanged_marker_does_not_extend_the_session() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv1", 10.0, now=100.0)
    t.observe("a", "s1", "rv1", 10.0, now=105.0)
    assert t.expires_at("a", "s1") == 110.0


def test_changed_marker_restarts_the_clock_on_the_observers_time() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv1", 10.0, now=100.0)
    t.observe("a", "s1", "rv2", 10.0, now=108.0)
    assert t.expires_at("a", "s1") == 118.0


def test_another_session_id_is_not_live_for_the_old_one() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv1", 10.0, now=100.0)
    t.observe("a", "s2", "rv2", 10.0, now=101.0)
    assert not t.is_live("a", "s1", 101.0)
    assert t.is_live("a", "s2", 101.0)


def test_forget_ends_the_session() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv1", 10.0, now=100.0)
    t.forget("a")
    assert t.session_of("a") is None
    assert not t.is_live("a", "s1", 100.0)


def test_lock_with_no_holder_is_free() -> None:
    assert lock_state(holder=None, session=None, tracker=SessionTracker(), now=0) is LockState.FREE


def test_lock_whose_holder_lease_is_gone_is_free() -> None:
    t = SessionTracker()
    assert lock_state(holder="a", session="s1", tracker=t, now=0) is LockState.FREE


def test_lock_whose_holder_has_another_session_is_free() -> None:
    t = SessionTracker()
    t.observe("a", "s2", "rv", 10.0, now=0.0)
    assert lock_state(holder="a", session="s1", tracker=t, now=1.0) is LockState.FREE


def test_lock_with_a_renewed_session_is_held() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv", 10.0, now=0.0)
    assert lock_state(holder="a", session="s1", tracker=t, now=9.0) is LockState.HELD


def test_lock_unrenewed_for_a_full_duration_is_takeable() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv", 10.0, now=0.0)
    assert lock_state(holder="a", session="s1", tracker=t, now=10.0) is LockState.TAKEABLE


def test_lock_without_session_annotation_is_free() -> None:
    t = SessionTracker()
    t.observe("a", "s1", "rv", 10.0, now=0.0)
    assert lock_state(holder="a", session=None, tracker=t, now=1.0) is LockState.FREE


def test_fencing_deadline_uses_a_20_percent_margin_by_default() -> None:
    assert fencing_deadline(100.0, 10.0) == pytest.approx(108.0)
    assert fencing_deadline(100.0, 10.0, margin=1.0) == pytest.approx(109.0)


def test_holder_fences_before_any_observer_may_take() -> None:
    # The observer saw the renewal after it was sent, so its expiry is later.
    sent, seen, duration = 50.0, 50.3, 10.0
    t = SessionTracker()
    t.observe("a", "s1", "rv", duration, now=seen)
    deadline = fencing_deadline(sent, duration)
    assert lock_state(holder="a", session="s1", tracker=t, now=deadline) is LockState.HELD


@pytest.mark.parametrize(
    ("duration", "renew"), [(10, 8), (10, 9), (3, 3), (2, 5), (0, 1), (10, 0)]
)
def test_unsafe_timing_is_refused(duration: float, renew: float) -> None:
    with pytest.raises(ValueError):
        LeaseTiming(duration=duration, renew_interval=renew)


def test_safe_timing_is_accepted() -> None:
    timing = LeaseTiming(duration=15, renew_interval=5)
    assert timing.effective_margin == pytest.approx(3.0)
    assert LeaseTiming(duration=3, renew_interval=1).effective_margin == pytest.approx(0.6)
