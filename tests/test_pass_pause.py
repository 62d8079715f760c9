"""The breath a group's loop takes between passes (kgroup.core.operator.wakeup.pass_pause):
none for a decision of a small group, as long as the decision for a large one, capped."""

from __future__ import annotations

import pytest

from kgroup.core.operator.wakeup import MAX_PASS_PAUSE, PASS_PAUSE_FROM, pass_pause


@pytest.mark.parametrize(("decide_seconds", "pause"), [
    (0.0, 0.0),
    (0.0004, 0.0),  # 64 partitions: no pause at all
    (PASS_PAUSE_FROM / 2, 0.0),
    (PASS_PAUSE_FROM, PASS_PAUSE_FROM),
    (0.04, 0.04),  # 10,000 partitions: the loop is held at most half the time
    (MAX_PASS_PAUSE, MAX_PASS_PAUSE),
    (3.0, MAX_PASS_PAUSE),  # never more than the cap, however slow the decision
])
def test_the_pause_is_the_decisions_time_within_bounds(decide_seconds: float,
                                                       pause: float) -> None:
    assert pass_pause(decide_seconds) == pytest.approx(pause)


def test_small_groups_take_no_pause_and_the_cap_bounds_a_takeover_delay() -> None:
    assert PASS_PAUSE_FROM <= 0.01  # a group of a few hundred partitions decides in < 1 ms
    assert MAX_PASS_PAUSE <= 0.5  # a takeover's pass waits at most this much more
