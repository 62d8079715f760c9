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
    assert lock_state(holder=None, session=None, expired=None) is LockState.FREE
    assert lock_state(holder=None, session=None, expired="s1") is LockState.FREE


def test_lock_held_by_a_session_without_expiry_mark_is_held() -> None:
    # No sidecar tracks another member's session any more: without the operator's mark
    # a held lock stays HELD, however long its holder looks silent.
    assert lock_state(holder="a", session="s1", expired=None) is LockState.HELD


def test_lock_marked_expired_for_its_session_is_takeable() -> None:
    assert lock_state(holder="a", session="s1", expired="s1") is LockState.TAKEABLE


def test_a_mark_of_another_session_does_not_make_a_lock_takeable() -> None:
    # a mark left from an older session (or written by hand) says nothing of this one
    assert lock_state(holder="a", session="s2", expired="s1") is LockState.HELD


def test_lock_without_session_annotation_is_free() -> None:
    assert lock_state(holder="a", session=None, expired=None) is LockState.FREE


def test_fencing_deadline_uses_a_20_percent_margin_by_default() -> None:
    assert fencing_deadline(100.0, 10.0) == pytest.approx(108.0)
    assert fencing_deadline(100.0, 10.0, margin=1.0) == pytest.approx(109.0)


def test_holder_fences_before_any_observer_may_take() -> None:
    # The observer (the operator) saw the renewal after it was sent, so its expiry is later.
    sent, seen, duration = 50.0, 50.3, 10.0
    t = SessionTracker()
    t.observe("a", "s1", "rv", duration, now=seen)
    deadline = fencing_deadline(sent, duration)
    assert t.is_live("a", "s1", deadline)
    expiry = t.expires_at("a", "s1")
    assert expiry is not None and expiry - deadline >= 0.2 * duration


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
