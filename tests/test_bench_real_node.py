"""The handoff figures (moves, most unowned, longest pause) of bench/bench_real_node.py,
computed from the sidecars' audit intervals (pure)."""

from __future__ import annotations

from kgroup_testing.sidecar_harness import Interval
from kgroup_testing.sidecar_harness import handoff_figures as rollout_figures


def iv(member: str, partition: int, start: float, end: float) -> Interval:
    return Interval(member, f"s-{member}", partition, 1, start, end)


def test_one_handoff_per_partition_is_one_move_each_with_its_pause() -> None:
    intervals = [iv("a", 0, 0, 10), iv("c", 0, 10.5, 99),   # 0: a -> c, 0.5 s unowned
                 iv("b", 1, 0, 12), iv("d", 1, 13, 99)]     # 1: b -> d, 1 s unowned
    fig = rollout_figures(intervals, 2, t0=5, t1=50)
    assert fig["moves"] == 2 and fig["moves_per_partition"] == 1.0
    assert fig["longest_pause_s"] == 1.0
    assert fig["max_unowned"] == 1  # never both at once


def test_a_partition_moved_twice_and_simultaneous_gaps_are_counted() -> None:
    intervals = [iv("a", 0, 0, 10), iv("b", 0, 11, 20), iv("c", 0, 21, 99),
                 iv("a", 1, 0, 10.2), iv("d", 1, 12, 99)]
    fig = rollout_figures(intervals, 2, t0=5, t1=50)
    assert fig["moves"] == 3
    assert fig["max_unowned"] == 2  # at 10.2..11 both are unowned
    assert abs(fig["longest_pause_s"] - 1.8) < 1e-9


def test_what_happened_outside_the_window_is_left_out() -> None:
    intervals = [iv("a", 0, 0, 1), iv("b", 0, 3, 4), iv("c", 0, 4, 99)]
    fig = rollout_figures(intervals, 1, t0=3.5, t1=50)
    assert fig["moves"] == 1 and fig["longest_pause_s"] == 0.0 and fig["max_unowned"] == 0
    assert rollout_figures([iv("a", 0, 10, 99)], 1, t0=5, t1=50)["max_unowned"] == 1


def test_a_pod_coming_back_under_its_name_is_a_pause_not_a_move() -> None:
    """A StatefulSet pod replaced by a rollout keeps its name: a partition it gets back is
    not moved, but the time it was unowned counts."""
    intervals = [Interval("w-0", "old", 0, 1, 0, 10), Interval("w-0", "new", 0, 2, 14, 99)]
    fig = rollout_figures(intervals, 1, t0=5, t1=50)
    assert fig["moves"] == 0 and fig["longest_pause_s"] == 4.0 and fig["max_unowned"] == 1
