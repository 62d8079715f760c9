"""The operator's load mode (spec.balance.mode: load) in the deterministic simulation: the
shipped decision code, skewed load reported by every app on its renewals, faults: no
safety violation, and the moves stay bounded and stop."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from kgroup.core.load import parse_load
from kgroup.core.operator.assignors import Assignee, get_assignor
from kgroup.core.operator.load_balance import busiest_ratio, load_bound
from kgroup.core.operator.load_window import LOAD_WINDOW_REPORTS
from kgroup.core.ranges import parse_ranges
from kgroup.crd_models import ConsumerGroupSpec
from kgroup_sim.__main__ import main, run_many
from kgroup_sim.checks import OscillationCheck
from kgroup_sim.load import LoadFeed, ZipfLoad, moves_between, zipf_loads
from kgroup_sim.variants import BALANCES, LOAD_WINDOWS
from kgroup_sim.world import SimConfig, World, run_seed

PARTITIONS = 16
SEEDS = range(4)
NOISE = 0.05
"""Each report's rate off by up to 5 %: what an app's smoothed rate (30 s) jitters by.
With +-20 % re-drawn at every renewal on 4 partitions per member, seed 1 moved once more
after 131 s without changing the busiest member (1.183x on the true loads): the band of
(1 + tolerance + margin) is measured on the noisy figures."""


def load_spec(**balance: Any) -> ConsumerGroupSpec:
    return ConsumerGroupSpec.model_validate({
        "partitions": PARTITIONS, "selector": {"matchLabels": {"app": "sim"}},
        "stabilizationWindowSeconds": 1, "stabilizationMaxDelaySeconds": 5,
        "lease": {"durationSeconds": 10, "renewIntervalSeconds": 3},
        "handoff": {"drainTimeoutSeconds": 2},
        "balance": {"mode": "load", "dwellSeconds": 20, **balance}})


def skewed(seed: int, noise: float = 0.0) -> LoadFeed:
    return LoadFeed(tuple(zipf_loads(PARTITIONS, 1.0, random.Random(seed))), noise)


def run(seed: int, spec: ConsumerGroupSpec, feed: LoadFeed, *, fault_time: float = 40.0,
        quiet_time: float = 20.0, kinds: tuple[str, ...] | None = None) -> tuple[Any, World]:
    extra: dict[str, Any] = {} if kinds is None else {"kinds": kinds}
    cfg = SimConfig(members=4, partitions=PARTITIONS, fault_time=fault_time, spec=spec,
                    load=feed, quiet_time=quiet_time, **extra)
    world = World(seed, cfg)
    return world.run(), world


def moves(world: World, since: float) -> int:
    total, before = 0, None
    for t, _, target in world.epochs:
        if before is not None and t > since:
            total += moves_between(before, target, PARTITIONS)
        before = target
    return total


def load_epochs(world: World) -> list[float]:
    """When the target changed with the same members: a load rebalance."""
    out, before = [], None
    for t, _, target in world.epochs:
        if before and target and set(before) == set(target) and before != target:
            out.append(t)
        before = target
    return out


def test_load_mode_under_faults_keeps_every_invariant_and_its_moves_stop() -> None:
    for seed in SEEDS:
        result, world = run(seed, load_spec(), skewed(seed))
        assert result.ok, (seed, result.violations)
        # after the faults, membership settles and load moves a bounded number, then
        # nothing (the run ends only after quiet_time converged and unchanged)
        assert moves(world, 40.0) <= 2 * PARTITIONS, seed
        assert result.converged_after is not None


def test_without_faults_skewed_load_is_balanced_in_one_rebalance_and_then_rests() -> None:
    for seed in SEEDS:
        feed = skewed(seed, noise=NOISE)
        result, world = run(seed, load_spec(), feed, fault_time=5.0, quiet_time=150.0,
                            kinds=())
        assert result.ok, (seed, result.violations)
        # at most two load rebalances (a new target for the same members; a join's
        # target is load-balanced already); the run ends only after 150 s (five load
        # refreshes) of noisy reports moved nothing
        assert len(load_epochs(world)) <= 2, (seed, world.epochs)
        assert result.sim_time - world.epochs[-1][0] >= 150.0
        final = {m: parse_ranges(r, limit=PARTITIONS) for m, r in world.epochs[-1][2].items()}
        members = [Assignee(m) for m in final]
        loads = list(feed.rates)
        assert busiest_ratio(final, loads, members) <= max(1.2, load_bound(loads, members))
        count_based = get_assignor("sticky").assign(PARTITIONS, members, {}, {})
        assert busiest_ratio(count_based, loads, members) > 1.2  # there was work to do



# ---- skewed load that shifts, noise at every renewal, and the oscillation check ------------

SHIFT_AT = 60.0
"""The hot set moves 30 s after the faults end (fault_time 30)."""


LATE_ABOVE = 1.2
"""The shipped trigger (1 + tolerance + margin). A window move from a target above it on
the true rates is late settling: a real imbalance the planner waited to be sure of,
because the reports' noise widens its band (kgroup.core.operator.load_status.GroupLoad.noise);
it is counted apart. Every other move in the window is a noise move, and none is allowed.
With +-20 % noise drawn at every renewal, 4 partitions per member, and the operator
planning on each member's latest report alone (before its load window), 161 of 1,000
seeds moved in a 240 s window; without hysteresis the target changes at nearly every
load refresh (every 30 s: 8 in 240 s, 4 in 120 s)."""


def shifting(balance: str = "real", *, noise: float = 0.2, settle: float = 150.0,
             window: float = 120.0) -> SimConfig:
    """What ``python -m kgroup_sim --load zipf --load-noise 0.2 --load-shift 60 --members 4
    --partitions 16 --fault-time 30 --window-moves 0 --late-above 1.2`` runs: the spec
    drawn from the seed with ``spec.balance`` set, every fault kind for 30 s, Zipf s = 0.8
    placed per seed and placed again at 60 s, each reported rate off by up to ``noise`` at
    every renewal."""
    return SimConfig(members=4, partitions=PARTITIONS, fault_time=30.0,
                     load=ZipfLoad(s=0.8, noise=noise, shift_at=SHIFT_AT),
                     balance=BALANCES[balance],
                     load_window=LOAD_WINDOWS.get(balance, LOAD_WINDOW_REPORTS),
                     oscillation=OscillationCheck(settle=settle, window=window,
                                                  max_moves=0, late_above=LATE_ABOVE))


def busiest_on(target: dict[str, str], rates: Sequence[float]) -> float:
    owned = {m: parse_ranges(r) for m, r in target.items()}
    return busiest_ratio(owned, list(rates), [Assignee(m) for m in sorted(owned)])


def test_a_zipf_load_is_drawn_per_seed_and_its_hot_set_moves_at_the_shift() -> None:
    model = ZipfLoad(s=0.8, noise=0.2, shift_at=SHIFT_AT)
    feed = model.for_seed(7, PARTITIONS)
    assert feed == model.for_seed(7, PARTITIONS)  # a seed replays
    assert feed.rates != model.for_seed(8, PARTITIONS).rates
    assert feed.shifted is not None and sorted(feed.shifted) == sorted(feed.rates)
    assert feed.shifted != feed.rates
    assert feed.rates_at(SHIFT_AT - 0.001) == feed.rates
    assert feed.rates_at(SHIFT_AT) == feed.shifted
    assert ZipfLoad(s=0.8).for_seed(7, PARTITIONS).rates_at(1e9) == feed.rates
    # noise is re-drawn at every report, within its band, around the rates of the moment
    held = range(PARTITIONS)
    rng = random.Random(1)
    reports = [parse_load(feed.summary(held, rng, SHIFT_AT + 1), partitions=PARTITIONS)
               for _ in range(2)]
    assert reports[0] is not None and reports[1] is not None
    assert reports[0].rates != reports[1].rates
    for p, rate in reports[0].rates.items():
        assert 0.79 * feed.shifted[p] <= rate <= 1.21 * feed.shifted[p]


def test_a_shifting_noisy_load_under_faults_rebalances_then_moves_nothing() -> None:
    """The real planner on the whole simulation: no violation (safety, liveness, and no
    noise move in the window 150-270 s after the shift: late settling apart), few moves,
    balanced on the new rates at the end; and the shift left work to do on some seed."""
    work = 0
    for seed in range(3):
        world = World(seed, shifting())
        result = world.run()
        assert result.ok, (seed, result.violations)
        assert result.window_moves is not None, seed
        assert result.moves <= 2 * PARTITIONS, (seed, result.moves)
        feed = world.load_feed
        assert feed is not None and feed.shifted is not None
        assert result.busiest is not None and result.load_bound is not None
        assert result.busiest <= max(1.2, result.load_bound) + 1e-9, seed
        before = [target for t, _, target in world.epochs if t <= SHIFT_AT][-1]
        work += busiest_on(before, feed.shifted) > 1.2
    assert work > 0


def test_without_hysteresis_noise_keeps_moving_partitions_and_the_check_says_so() -> None:
    """The broken balance (tolerance 0, margin 0, dwell 0, through spec.balance) on the
    same runs: the target keeps changing under the same noise, more often than the
    window allows: an oscillation violation. (Seeds 0 and 2: seed 1's run changed with
    the load figures' timing and sizing changes of this release, and its broken planner
    now rests by the window; the slow sweep below counts the seeds caught.)"""
    for seed in (0, 2):
        result = run_seed(seed, shifting("no-hysteresis"))
        assert [v.kind for v in result.violations] == ["oscillation"], (seed, result.violations)
        assert result.window_moves is not None and result.window_moves > PARTITIONS // 2


LOAD_SEEDS = 200
"""Seeds of the slow sweep; docs/benchmarks.md has the CLI's thousands."""


@pytest.mark.slow  # a seed sweep: make check runs the three seeds above
def test_on_every_seed_the_planner_rests_after_a_shift_and_without_hysteresis_it_does_not(
) -> None:
    """No noise move on any seed; both broken variants are caught: without hysteresis on
    most seeds, without the load window (the latest report alone) on some."""
    cfg = shifting(window=240.0)
    failed = [(r.seed, r.violations[0]) for r in run_many(range(LOAD_SEEDS), cfg, jobs=2)
              if not r.ok]
    assert failed == [], failed[:3]
    broken = list(run_many(range(LOAD_SEEDS // 4), shifting("no-hysteresis", window=240.0),
                           jobs=2))
    caught = [r.seed for r in broken if any(v.kind == "oscillation" for v in r.violations)]
    # not every seed: the window averages the noise for the broken balance too
    assert len(caught) >= 0.5 * len(broken), caught
    unsmoothed = list(run_many(range(LOAD_SEEDS // 4), shifting("no-smoothing", window=240.0),
                               jobs=2))
    caught = [r.seed for r in unsmoothed
              if any(v.kind == "oscillation" for v in r.violations)]
    assert caught, "planning on the latest report alone made no noise move on any seed"


def test_the_cli_fails_the_broken_balance_and_prints_how_to_replay_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--load", "zipf", "--load-noise", "0.2", "--load-shift", "60", "--members", "4",
            "--partitions", str(PARTITIONS), "--fault-time", "30", "--window", "120",
            "--seed", "0"]
    assert main([*args, "--balance", "no-hysteresis"]) == 1
    out = capsys.readouterr().out
    assert "violations: 1 seeds (oscillation=1)" in out
    assert "--load zipf --load-skew 0.8 --load-noise 0.2 --load-shift 60 --balance " \
           "no-hysteresis --settle 180 --window 120 --window-moves 0 --verbose" in out
    assert "1 of 1 seeds moved any" in out
