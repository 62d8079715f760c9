"""The figures of bench/bench_real_node.py (pure): the handoff figures (moves, most unowned,
longest ownership gap) from the sidecars' audit intervals, and the consumption figures
(pauses, processed elsewhere) from samples of the fenced sink."""

from __future__ import annotations

from kgroup_devcluster.consumption import (
    Sample,
    pause_figures,
    pauses,
    processed_elsewhere,
    stalled,
)
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


# ---- consumption, as the fenced sink records it (kgroup_devcluster.consumption) ----------


def series(rows: list[tuple[float, int, int, int]]) -> list[Sample]:
    """(t, committed offset, token, tail) rows; offset 0: never planned, tail 0: empty."""
    return [Sample(t, (o, 0) if o else None, tok, (tail, 0) if tail else None)
            for t, o, tok, tail in rows]


def test_a_pause_is_events_pending_while_the_offset_stands_still() -> None:
    s = series([(0, 5, 1, 6), (1, 6, 1, 7), (2, 6, 1, 8), (3, 6, 1, 9), (4, 9, 1, 10)])
    # pending from 1 (6 < 7) until the advance seen at 4; the advance at 1 ends nothing
    assert pauses(s, 0, 10) == [(0, 1), (1, 4), (4, 4)]
    assert pause_figures({0: s}, 0, 10)["longest_pause_s"] == 3


def test_no_events_pending_is_no_pause_however_long_the_offset_stands() -> None:
    s = series([(0, 5, 1, 5), (1, 5, 1, 5), (9, 5, 1, 5), (10, 5, 1, 6), (11, 6, 1, 6)])
    assert pauses(s, 0, 20) == [(10, 11)]


def test_a_pause_still_open_at_the_end_counts_up_to_it_and_the_window_cuts() -> None:
    s = series([(0, 5, 1, 6), (1, 5, 1, 7), (2, 5, 1, 8), (3, 5, 1, 9)])
    assert pauses(s, 0, 10) == [(0, 3)]
    assert pauses(s, 1.5, 10) == [(2, 3)]
    assert stalled({0: s}, within=3) == [0] and stalled({0: s}, within=3.5) == []


def test_a_first_plan_storing_where_reading_starts_is_not_an_advance() -> None:
    """The sink's offset appears at the first plan (the handed position); a PySpark app's
    first batch may take much longer to commit: consuming only from that commit."""
    s = series([(0, 0, 0, 9), (1, 1, 2, 9), (10, 1, 2, 9), (20, 1, 2, 9), (21, 5, 2, 9)])
    assert pauses(s, 0, 30) == [(0, 21), (21, 21)]
    assert stalled({0: s[:4]}, within=15) == [0]
    assert stalled({0: s}, within=15) == []


def test_per_partition_figures_are_each_partitions_longest_pause() -> None:
    a = series([(0, 1, 1, 2), (1, 2, 1, 3), (2, 3, 1, 4)])         # 1 s pauses
    b = series([(0, 1, 1, 2), (5, 2, 1, 3), (6, 3, 1, 4)])         # one of 5 s
    c = series([(0, 1, 1, 1), (5, 1, 1, 1), (6, 1, 1, 1)])         # nothing pending
    fig = pause_figures({0: a, 1: b, 2: c}, 0, 10)
    assert fig["longest_pause_s"] == 5 and fig["per_partition_longest_max_s"] == 5
    assert fig["per_partition_longest_p50_s"] == 1
    assert fig["per_partition_longest_s"] == {"0": 1, "1": 5, "2": 0}


def test_processed_elsewhere_needs_an_advance_under_a_newer_token() -> None:
    s = series([(0, 5, 3, 9),
                (1, 6, 3, 9),    # the leaving owner's last commit (token 3): not it
                (2, 6, 4, 9),    # the next owner planned (token raised): not yet
                (3, 6, 4, 9),
                (4, 8, 4, 9)])   # its first commit
    assert processed_elsewhere(s, 0.5, token=3) == 3.5
    assert processed_elsewhere(s[:4], 0.5, token=3) is None
    # a pod that never took a partition up: the previous owner's token stays, no figure
    assert processed_elsewhere(series([(0, 5, 2, 9), (1, 6, 2, 9)]), 0, token=3) is None
