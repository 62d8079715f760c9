"""The load's part of a simulated run's verdict (``SimConfig.load``,
``SimConfig.oscillation``): where the convergence phase starts (the load's last shift, when
it comes after the faults), the window in which load rebalances must have stopped, and the
figures a :class:`~kgroup_sim.world.Result` reports of the target's moves and of the final
balance.

Bookkeeping only: the plans are the shipped planner's (``spec.balance.mode: load``, run by
:mod:`kgroup_sim.control`); the window's rule is :class:`kgroup_sim.checks.OscillationCheck`
and its count :func:`kgroup_sim.checks.target_moves`; the balance figures are the shipped
:func:`~kgroup.core.operator.load_balance.busiest_ratio` and
:func:`~kgroup.core.operator.load_balance.load_bound`, on the true (noise-free) rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kgroup.core.operator.assignors import Assignee
from kgroup.core.operator.load_balance import busiest_ratio, load_bound
from kgroup.core.ranges import parse_ranges
from kgroup_sim.checks import target_moves

if TYPE_CHECKING:
    from kgroup_sim.world import World

__all__ = ["LoadFigures", "check_window", "convergence_start", "late_settling", "load_figures"]


@dataclass(frozen=True)
class LoadFigures:
    """The target's changes after the convergence phase started: partitions moved,
    targets that moved any, and when the last came (simulated s after the start); the
    partitions moved in the oscillation window (None: not checked); the final target's
    busiest member over the mean and the best any assignment could do (None: no load)."""

    moves: int
    rebalances: int
    last_move_after: float | None
    window_moves: int | None
    busiest: float | None
    load_bound: float | None
    late_moves: int | None = None  # of the window's, late settling (OscillationCheck)


def convergence_start(world: World) -> float:
    """The faults are over: run on to the load's last shift when it comes later, and
    return when the convergence phase starts (the shift, or the end of the faults)."""
    start = world.cfg.fault_time
    feed = world.load_feed
    shift = feed.shift_at if feed is not None else None
    if shift is not None and shift > start and not world.checker.violations:
        world.kernel.run_until(shift, world.after_event)
        start = shift
    return start


def late_settling(world: World, opens: float, closes: float, above: float | None
                  ) -> tuple[int, int]:
    """``(partitions moved, changes)`` in ``(opens, closes]`` that started from a target
    whose busiest member was above ``above`` times the mean on the true rates of that
    moment (late settling: :class:`~kgroup_sim.checks.OscillationCheck`)."""
    feed = world.load_feed
    if above is None or feed is None:
        return 0, 0
    moved = changes = 0
    for (_, _, before), (t, epoch, after) in zip(world.epochs, world.epochs[1:], strict=False):
        if not opens < t <= closes:
            continue
        rates = list(feed.rates_at(t))
        held = {m: [p for p in parse_ranges(r) if p < len(rates)] for m, r in before.items()}
        members = [Assignee(m) for m in sorted(held) if held[m]]
        if members and busiest_ratio(held, rates, members) > above:
            n, c = target_moves([(0.0, None, before), (t, epoch, after)], -1.0)
            moved, changes = moved + n, changes + c
    return moved, changes


def check_window(world: World, start: float) -> tuple[int, int] | None:
    """With ``SimConfig.oscillation``, once converged from ``start``: run through the
    window (``settle`` seconds after ``start``, ``window`` long), fail ``oscillation``
    when the target moved more than it allows (late settling apart), then converge again
    (still live at the end). Returns the partitions moved in the window and how many of
    them were late settling; None: not checked."""
    cfg, checker, osc = world.cfg, world.checker, world.cfg.oscillation
    if osc is None or checker.violations:
        return None
    opens = start + osc.settle
    closes = opens + osc.window
    if world.kernel.now < closes:
        world.kernel.run_until(closes, world.after_event)
    window_moves, changes = target_moves(world.epochs, opens, closes)
    late, late_changes = late_settling(world, opens, closes, osc.late_above)
    noise_moves, noise_changes = window_moves - late, changes - late_changes
    if not checker.violations and osc.exceeded(noise_moves, noise_changes):
        checker.fail("oscillation", closes, (
            f"{noise_moves} partitions moved by {noise_changes} rebalances in "
            f"[{opens:.0f}, {closes:.0f}] s with the load steady"
            f"{f' ({late} more settling late)' if late else ''} (at most "
            f"{osc.max_moves} partitions, {osc.max_rebalances} rebalances); settle "
            f"{osc.settle:g} s after "
            f"{'the shift' if start > cfg.fault_time else 'the faults'}"))
    if not checker.violations:
        world.converge(max(closes, world.kernel.now))
    return window_moves, late


def load_figures(world: World, start: float, window: tuple[int, int] | None) -> LoadFigures:
    """The figures of the run's end, from the target's history (``World.epochs``) and,
    with a load, the final target on the true rates."""
    epochs = world.epochs
    moves, rebalances = target_moves(epochs, start)
    last = max((t for t, _, _ in epochs if t > start), default=None)
    busiest = bound = None
    if world.load_feed is not None and epochs:
        rates = list(world.load_feed.rates_at(world.kernel.now))
        final = {m: [p for p in parse_ranges(r) if p < len(rates)]
                 for m, r in epochs[-1][2].items()}
        members = [Assignee(m) for m in sorted(final)]
        if members:
            busiest = busiest_ratio(final, rates, members)
            bound = load_bound(rates, members)
    return LoadFigures(moves=moves, rebalances=rebalances,
                       last_move_after=None if last is None else last - start,
                       window_moves=None if window is None else window[0],
                       busiest=busiest, load_bound=bound,
                       late_moves=None if window is None else window[1])
