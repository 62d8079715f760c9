"""The autoscaler's rule (kgroup.core.operator.autoscale), driven on a fake clock.

A small world stands in for the group: the recommendation is taken every 30 s (as the
operator takes status.load), the workload's pods join 60 s after a change (or
``join_seconds``) and the group rebalances for 20 s after each join. Each scenario checks
the changes made; the broken variants at the end (no scale-down delay, no tolerance, up
at the first look) fail the same checks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from kgroup.core.operator.autoscale import (
    SETTLE_SECONDS,
    Autoscaler,
    Saved,
    ScaleChange,
    ScaleSettings,
)

SAMPLE_SECONDS = 30.0
JOIN_SECONDS = 60.0
REBALANCE_SECONDS = 20.0
TICK = 10.0


@dataclass
class World:
    replicas: int
    settings: ScaleSettings
    members: int = 0
    members_at: float = 0.0  # when the members last changed (rebalancing after it)
    changed_at: float = -1e9

    def __post_init__(self) -> None:
        self.members = self.replicas


def run(recommend: Callable[[float], int], *, replicas: int, minutes: float,
        settings: ScaleSettings | None = None, scaler: Autoscaler | None = None,
        restarts: Sequence[float] = (), restore: bool = True,
        join_seconds: float = JOIN_SECONDS) -> list[tuple[float, ScaleChange]]:
    """Every change the autoscaler makes over ``minutes`` (time, change); at each of
    ``restarts`` the operator restarts: a new autoscaler, restored from what the old one
    saved (``restore``) or not; the restarted one is fed the last take again, as a
    restarted operator's first figures would be."""
    settings = settings or ScaleSettings(min_members=1, max_members=64,
                                         scale_down_delay_seconds=300)
    scaler = scaler or Autoscaler()
    world = World(replicas, settings)
    changes: list[tuple[float, ScaleChange]] = []
    now = 0.0
    while now <= minutes * 60:
        if now in restarts:
            saved = scaler.saved(world.replicas, settings)
            scaler = Autoscaler(up_takes=scaler.up_takes)
            if restore:
                scaler.restore(saved, replicas=world.replicas, settings=settings)
        taken = math.floor(now / SAMPLE_SECONDS) * SAMPLE_SECONDS
        scaler.observe(taken, recommend(taken), settings)
        if world.members != world.replicas and now >= world.changed_at + join_seconds:
            world.members, world.members_at = world.replicas, now
        rebalancing = now < world.members_at + REBALANCE_SECONDS and world.members_at > 0
        change, _ = scaler.decide(now, replicas=world.replicas, settings=settings,
                                  rebalancing=rebalancing, members=world.members)
        if change is not None:
            assert change.previous == world.replicas
            world.replicas, world.changed_at = change.replicas, now
            scaler.scaled(now, change)
            changes.append((now, change))
        now += TICK
    return changes


def sizes(changes: list[tuple[float, ScaleChange]]) -> list[int]:
    return [c.replicas for _, c in changes]


def step_x3_and_back(t: float) -> int:
    """8 members' worth for 10 min, 24 for 20 min, 8 again."""
    return 24 if 600 <= t < 1800 else 8


def ramp_x3_and_back(t: float) -> int:
    """The same step as the sizing sees it: the backlog of the first minute asks for
    more than the new rate alone, then the rate alone (24)."""
    if 600 <= t < 660:
        return 16
    if 660 <= t < 720:
        return 30
    return 24 if 720 <= t < 1800 else 8


def noisy(level: float, seed: int, spread: float = 0.2) -> Callable[[float], int]:
    """``level`` members' worth of demand, +-``spread`` re-drawn at every sample."""
    rng = random.Random(seed)
    drawn: dict[float, int] = {}

    def recommend(t: float) -> int:
        if t not in drawn:
            drawn[t] = math.ceil(level * rng.uniform(1 - spread, 1 + spread))
        return drawn[t]

    return recommend


DEFAULTS = ScaleSettings(min_members=1, max_members=64, scale_down_delay_seconds=300)


# -- the checks (the broken variants below fail them) --------------------------------------


def check_step(settings: ScaleSettings) -> None:
    check_step_with(Autoscaler(), settings)


def check_step_with(scaler: Autoscaler, settings: ScaleSettings = DEFAULTS) -> None:
    changes = run(step_x3_and_back, replicas=8, minutes=70, settings=settings,
                  scaler=scaler)
    assert sizes(changes) == [24, 8], changes
    up, down = changes[0][0], changes[1][0]
    assert up == 630  # on the second look: the take after the step's first
    assert down >= 1800 + settings.scale_down_delay_seconds  # only after the delay


def check_dip(settings: ScaleSettings) -> None:
    """A dip shorter than the delay changes nothing."""
    def dip(t: float) -> int:
        return 8 if 600 <= t < 720 else 24
    assert run(dip, replicas=24, minutes=30, settings=settings) == []


def check_noise(settings: ScaleSettings, seed: int) -> None:
    """+-20 % around 10 members: the recommendations lie in [8, 12]. Started at the top
    of the band, nothing changes in a day; started at its middle, only ups, in the first
    hour, to at most the top."""
    assert run(noisy(10, seed), replicas=12, minutes=24 * 60, settings=settings) == []
    changes = run(noisy(10, seed), replicas=10, minutes=24 * 60, settings=settings)
    assert all(c.replicas > c.previous for _, c in changes), changes
    assert all(t < 3600 for t, _ in changes), changes
    assert len(changes) <= 2




def test_a_step_x3_and_back_takes_one_change_each_way_then_stays() -> None:
    check_step(DEFAULTS)


def test_a_step_seen_through_the_backlog_reaches_its_size_in_two_changes_then_stays() -> None:
    changes = run(ramp_x3_and_back, replicas=8, minutes=70, settings=DEFAULTS)
    # up twice (16 on the second look, then 30 once the 16 members joined at 690 and
    # rebalanced), never down to 24 (30 / 1.5 = 20 < 24: within the tolerance), down to 8
    # only after the delay, then nothing
    assert [(t, c.replicas) for t, c in changes] == [(630, 16), (710, 30), (2100, 8)]


def test_a_dip_shorter_than_the_delay_changes_nothing() -> None:
    check_dip(DEFAULTS)


@pytest.mark.parametrize("seed", range(20))
def test_noise_of_20_percent_makes_no_change_once_at_the_top_of_its_band(seed: int) -> None:
    check_noise(DEFAULTS, seed)


@pytest.mark.parametrize("seed", range(30))
def test_inside_a_band_within_the_tolerance_the_size_only_rises_then_never_changes(
        seed: int) -> None:
    """The argument of the module docstring, on adversarial bands: every recommendation
    in [L, U] with U <= (1 + tolerance) * L, in long runs of the band's ends; started
    inside the band, no scale-down ever, at most U - L changes up."""
    rng = random.Random(seed)
    tolerance = rng.choice([0.2, 0.5, 1.0])
    low = rng.randint(1, 30)
    high = math.floor((1 + tolerance) * low + 1e-9)
    runs: list[tuple[float, int]] = []
    t = 0.0
    while t < 6 * 3600:
        runs.append((t, rng.choice([low, high, rng.randint(low, high)])))
        t += rng.choice([30.0, 600.0, 1800.0])

    def recommend(at: float) -> int:
        return next(v for start, v in reversed(runs) if start <= at)

    settings = ScaleSettings(min_members=1, max_members=100, scale_down_delay_seconds=300,
                             scale_down_tolerance=tolerance)
    changes = run(recommend, replicas=rng.randint(low, high), minutes=6 * 60,
                  settings=settings)
    assert all(c.replicas > c.previous for _, c in changes), (low, high, changes)
    assert len(changes) <= high - low


def test_a_drop_smaller_than_the_tolerance_is_kept() -> None:
    # 12 -> 9 is a drop of 25 %: within the default tolerance (0.5), no change
    assert run(lambda t: 12 if t < 600 else 9, replicas=12, minutes=60,
               settings=DEFAULTS) == []
    # 12 -> 8 neither (8 x 1.5 = 12, not below 12: both are within +-20 % of 10)
    assert run(lambda t: 12 if t < 600 else 8, replicas=12, minutes=60,
               settings=DEFAULTS) == []
    # 12 -> 7: 7 x 1.5 = 10.5 < 12, down after the delay
    changes = run(lambda t: 12 if t < 600 else 7, replicas=12, minutes=60, settings=DEFAULTS)
    assert sizes(changes) == [7] and changes[0][0] >= 900


def test_scale_down_goes_to_the_largest_recommendation_of_the_window() -> None:
    def falling(t: float) -> int:
        if t < 600:
            return 24
        return 8 if t >= 660 else 12  # 12 for a minute, then 8
    changes = run(falling, replicas=24, minutes=30, settings=DEFAULTS)
    # 12 was asked for within the window: not below it; and not 8 then (8 x 1.5 = 12 is
    # not below 12)
    assert [(t, c.replicas) for t, c in changes] == [(900, 12)]


def test_bounds_clamp_the_recommendation_and_the_replicas() -> None:
    bounded = ScaleSettings(min_members=3, max_members=10, scale_down_delay_seconds=60)
    assert sizes(run(lambda t: 40, replicas=4, minutes=5, settings=bounded)) == [10]
    # replicas set by hand outside the bounds are brought in at once
    assert sizes(run(lambda t: 5, replicas=1, minutes=5, settings=bounded)) == [5]
    assert sizes(run(lambda t: 5, replicas=30, minutes=5, settings=bounded)) == [10, 5]
    # lowered bounds apply at once, even while the last change's pods are still joining
    scaler = Autoscaler()
    scaler.observe(0.0, 40, bounded)
    scaler.observe(30.0, 40, bounded)
    change, _ = scaler.decide(30.0, replicas=4, settings=bounded, rebalancing=False,
                              members=4)
    assert change is not None and change.replicas == 10
    scaler.scaled(30.0, change)
    lower = ScaleSettings(min_members=3, max_members=6)
    change, _ = scaler.decide(35.0, replicas=10, settings=lower, rebalancing=False,
                              members=4)
    assert change == ScaleChange(6, 10, "above maxMembers 6")
    # never more members than partitions
    few = ScaleSettings(min_members=1, max_members=64, partitions=6)
    assert sizes(run(lambda t: 40, replicas=2, minutes=5, settings=few)) == [6]
    assert few.clamp(0) == 1
    assert ScaleSettings(min_members=9, max_members=4).clamp(7) == 4


def test_no_change_while_the_group_rebalances_or_before_it_has_its_members() -> None:
    scaler = Autoscaler()
    scaler.observe(0.0, 20, DEFAULTS)
    scaler.observe(30.0, 20, DEFAULTS)
    change, _ = scaler.decide(30.0, replicas=8, settings=DEFAULTS, rebalancing=True,
                              members=8)
    assert change is None and "rebalancing" in scaler.waiting
    change, _ = scaler.decide(31.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                              members=8)
    assert change == ScaleChange(20, 8, "recommended 20 members, 8 replicas: up")
    scaler.scaled(31.0, change)
    scaler.observe(60.0, 30, DEFAULTS)
    scaler.observe(90.0, 30, DEFAULTS)
    change, wait = scaler.decide(91.0, replicas=20, settings=DEFAULTS, rebalancing=False,
                                 members=9)
    assert change is None and wait == pytest.approx(31.0 + SETTLE_SECONDS - 91.0)
    # pods that never start do not freeze it
    change, _ = scaler.decide(31.0 + SETTLE_SECONDS, replicas=20, settings=DEFAULTS,
                              rebalancing=False, members=9)
    assert change is not None and change.replicas == 30


def test_a_scale_up_waits_for_the_second_look_and_a_single_spike_changes_nothing() -> None:
    scaler = Autoscaler()
    scaler.observe(0.0, 20, DEFAULTS)
    change, _ = scaler.decide(1.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                              members=8)
    assert change is None and "next figures" in scaler.waiting
    scaler.observe(30.0, 8, DEFAULTS)  # the spike is gone
    assert scaler.decide(31.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                         members=8) == (None, None)
    spike = lambda t: 40 if t == 600 else 8  # noqa: E731
    assert run(spike, replicas=8, minutes=30, settings=DEFAULTS) == []
    # the second look goes to the latest figure, not the first
    scaler.observe(60.0, 12, DEFAULTS)
    scaler.observe(90.0, 16, DEFAULTS)
    change, _ = scaler.decide(91.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                              members=8)
    assert change == ScaleChange(16, 8, "recommended 16 members, 8 replicas: up")


def test_the_time_a_scale_up_took_to_join_is_kept() -> None:
    changes = run(step_x3_and_back, replicas=8, minutes=20, settings=DEFAULTS)
    assert [t for t, _ in changes] == [630]
    scaler = Autoscaler()
    scaler.observe(0.0, 20, DEFAULTS)
    scaler.observe(30.0, 20, DEFAULTS)
    change, _ = scaler.decide(30.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                              members=8)
    assert change is not None
    scaler.scaled(30.0, change)
    scaler.decide(80.0, replicas=20, settings=DEFAULTS, rebalancing=False, members=12)
    assert scaler.start_seconds is None  # not all joined yet
    scaler.decide(125.0, replicas=20, settings=DEFAULTS, rebalancing=False, members=20)
    assert scaler.start_seconds == pytest.approx(95.0)


def test_a_recommendation_taken_before_the_last_change_is_ignored() -> None:
    scaler = Autoscaler()
    scaler.observe(-30.0, 20, DEFAULTS)
    scaler.observe(0.0, 20, DEFAULTS)
    change, _ = scaler.decide(5.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                              members=8)
    assert change is not None
    scaler.scaled(5.0, change)
    scaler.observe(3.0, 2, DEFAULTS)  # measured before the change: stale
    assert list(scaler.samples) == [(5.0, 20)]
    assert scaler.decide(2000.0, replicas=20, settings=DEFAULTS, rebalancing=False,
                         members=20) == (None, None)


def test_no_recommendation_or_unknown_replicas_change_nothing() -> None:
    scaler = Autoscaler()
    scaler.observe(0.0, None, DEFAULTS)
    assert scaler.decide(1.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                         members=8) == (None, None)
    scaler.observe(0.0, 20, DEFAULTS)
    assert scaler.decide(1.0, replicas=None, settings=DEFAULTS, rebalancing=False,
                         members=8) == (None, None)


def test_the_wait_before_a_scale_down_is_reported() -> None:
    scaler = Autoscaler()
    scaler.observe(0.0, 4, DEFAULTS)
    change, wait = scaler.decide(100.0, replicas=12, settings=DEFAULTS, rebalancing=False,
                                 members=12)
    assert change is None and wait == pytest.approx(200.0)
    assert "before scaling down" in scaler.waiting


# -- a restart of the operator: what the status keeps -------------------------------------


@pytest.mark.parametrize("restart", [1810.0, 1950.0, 2090.0])
def test_a_restart_in_the_scale_down_window_changes_no_decision(restart: float) -> None:
    alone = run(step_x3_and_back, replicas=8, minutes=70, settings=DEFAULTS)
    assert run(step_x3_and_back, replicas=8, minutes=70, settings=DEFAULTS,
               restarts=[restart]) == alone


def sooner_30(t: float) -> int:
    """16 members' worth from 600 s, 30 from 660 s (before the 16's pods, slow to start,
    join at 750)."""
    return 8 if t < 600 else 16 if t < 660 else 30


SLOW_PODS = 120.0  # seconds pods take to join, in the sooner_30 scenario


def test_a_restart_while_the_last_change_settles_still_waits_for_its_members() -> None:
    alone = run(sooner_30, replicas=8, minutes=30, settings=DEFAULTS,
                join_seconds=SLOW_PODS)
    # up on the second look (630), then 30 only once the 16 joined (750) and rebalanced
    # (20 s)
    assert [(t, c.replicas) for t, c in alone] == [(630, 16), (770, 30)]
    assert run(sooner_30, replicas=8, minutes=30, settings=DEFAULTS, restarts=[640.0],
               join_seconds=SLOW_PODS) == alone


def test_a_restart_between_the_two_looks_still_scales_up_on_the_second() -> None:
    """The take a scale-up waits to see confirmed is kept (status.autoscaling.scaleUp*):
    a restarted operator that is not fed it again still scales up on the next take."""
    scaler = Autoscaler()
    scaler.observe(0.0, 20, DEFAULTS)
    scaler.decide(1.0, replicas=8, settings=DEFAULTS, rebalancing=False, members=8)
    saved = scaler.saved(8, DEFAULTS)
    assert (saved.above_at, saved.above_value, saved.above_replicas) == (0.0, 20, 8)
    for restore, expected in ((True, 20), (False, None)):
        again = Autoscaler()
        if restore:
            again.restore(saved, replicas=8, settings=DEFAULTS)
        again.observe(30.0, 20, DEFAULTS)
        change, _ = again.decide(31.0, replicas=8, settings=DEFAULTS, rebalancing=False,
                                 members=8)
        assert (change.replicas if change else None) == expected
    # kept only while the replicas are those it was above
    moved = Autoscaler()
    moved.restore(saved, replicas=24, settings=DEFAULTS)
    assert not moved.samples


@pytest.mark.parametrize("seed", range(40))
def test_restarts_at_random_moments_change_no_decision(seed: int) -> None:
    """Steps, dips and noise at random levels, restarts at random moments: the same
    changes at the same moments as without them."""
    rng = random.Random(seed)
    levels: list[tuple[float, int]] = []
    t = 0.0
    while t < 4 * 3600:
        levels.append((t, rng.randint(1, 40)))
        t += rng.choice([30.0, 120.0, 600.0, 1800.0])

    def recommend(at: float) -> int:
        return next(v for start, v in reversed(levels) if start <= at)

    settings = ScaleSettings(min_members=rng.randint(1, 3), max_members=rng.randint(20, 40),
                             scale_down_delay_seconds=rng.choice([60, 300, 900]),
                             scale_down_tolerance=rng.choice([0.0, 0.2, 0.5]))
    restarts = sorted(rng.randrange(0, 4 * 360) * TICK for _ in range(rng.randint(1, 8)))
    alone = run(recommend, replicas=8, minutes=4 * 60, settings=settings)
    assert run(recommend, replicas=8, minutes=4 * 60, settings=settings,
               restarts=restarts) == alone, restarts


def test_a_saved_window_for_other_replicas_or_a_peak_within_the_tolerance_is_dropped() -> None:
    saved = Saved(below_since=100.0, below_peak=4, below_replicas=12)
    scaler = Autoscaler()
    scaler.restore(saved, replicas=10, settings=DEFAULTS)  # set by hand since
    assert not scaler.samples
    scaler.restore(saved, replicas=12, settings=ScaleSettings(
        min_members=1, max_members=64, scale_down_tolerance=2.0))  # 4 x 3 = 12: not below
    assert not scaler.samples
    scaler.restore(saved, replicas=12, settings=DEFAULTS)
    assert list(scaler.samples) == [(100.0, 4)]


# -- broken variants: each fails a check above ---------------------------------------------


def test_forgetting_the_last_change_on_a_restart_changes_again_before_the_members_join(
        ) -> None:
    forgot = run(sooner_30, replicas=8, minutes=30, settings=DEFAULTS, restarts=[640.0],
                 restore=False, join_seconds=SLOW_PODS)
    # 30 asked for at 690 while the 16 members' pods were still starting
    assert [(t, c.replicas) for t, c in forgot] == [(630, 16), (690, 30)]


def test_forgetting_the_window_on_a_restart_delays_a_due_scale_down() -> None:
    alone = run(step_x3_and_back, replicas=8, minutes=70, settings=DEFAULTS)
    forgot = run(step_x3_and_back, replicas=8, minutes=70, settings=DEFAULTS,
                 restarts=[2090.0], restore=False)
    assert forgot != alone
    # the new window starts with the first recommendation after the restart: 270 s late
    assert forgot[1][0] - alone[1][0] >= DEFAULTS.scale_down_delay_seconds - SAMPLE_SECONDS




def test_without_a_scale_down_delay_a_dip_scales_down_and_back_up() -> None:
    broken = ScaleSettings(min_members=1, max_members=64, scale_down_delay_seconds=0)
    with pytest.raises(AssertionError):
        check_dip(broken)
    assert sizes(run(lambda t: 8 if 600 <= t < 720 else 24, replicas=24, minutes=30,
                     settings=broken)) == [8, 24]


def test_without_a_tolerance_noise_keeps_changing_the_size() -> None:
    broken = ScaleSettings(min_members=1, max_members=64, scale_down_delay_seconds=300,
                           scale_down_tolerance=0.0)
    failed = 0
    for seed in range(20):
        try:
            check_noise(broken, seed)
        except AssertionError:
            failed += 1
    assert failed >= 10
    flaps = run(noisy(10, 0), replicas=10, minutes=24 * 60, settings=broken)
    assert len(flaps) > 20  # down and up again all day


def test_up_at_the_first_look_follows_a_spike() -> None:
    """The broken variant of the second look: one take above the replicas scales up."""
    spike = lambda t: 40 if t == 600 else 8  # noqa: E731
    first_look = Autoscaler(up_takes=1)
    assert sizes(run(spike, replicas=8, minutes=30, settings=DEFAULTS,
                     scaler=first_look)) == [40, 8]
    with pytest.raises(AssertionError):
        check_step_with(Autoscaler(up_takes=1))
