"""Reshapes in the deterministic simulation (kgroup_sim): spec.partitions changed while
faults run, sealed partitions read to their seal and completed by the simulated apps
through the sidecar's completed release, the ``reshape-order`` check (no successor
acquired before its predecessors' Leases record their completion) and the ``reshape-end``
bound, and the broken layout that skips the wait, caught."""

from __future__ import annotations

import dataclasses

import pytest

from kgroup.core.lineage import Uniform, initial
from kgroup_sim import Fault, SimConfig, run_seed
from kgroup_sim.__main__ import main, run_many
from kgroup_sim.checks import Checker
from kgroup_sim.variants import SkipsTheWait
from kgroup_sim.world import World

RESHAPE = SimConfig(members=4, partitions=16, fault_time=40, reshape=(24, 8),
                    seal_drain=(0.5, 8.0))
"""16 -> 24 -> 8 partitions at two times drawn from the seed during 40 s of every fault
kind (crashes, GC pauses, network cuts, operator restarts, joins, leaves, lost and
replayed events and requests); each sealed partition's backlog 0.5-8 s, a quarter empty."""
SKIPS = dataclasses.replace(RESHAPE, layout=SkipsTheWait)
SLOW_SEEDS = 40
SAFETY_KINDS = {"safety", "token-order", "sink", "store-token"}


def quiet(**overrides: object) -> SimConfig:
    """No fault but the ones a scenario scripts; 8 -> 12 in the middle of 30 s."""
    base: dict[str, object] = dict(
        members=3, partitions=8, fault_time=30.0, kinds=(), event_loss=0.0,
        event_replay=0.0, message_loss=0.0, slow=0.0, ack_never=0.0, reshape=(12,),
        reshape_window=(0.5, 0.5), seal_drain=(5.0, 5.0), seal_empty=0.0)
    base.update(overrides)
    return SimConfig(**base)  # type: ignore[arg-type]


def test_reshapes_under_faults_complete_in_order_and_end_within_their_bound() -> None:
    for seed in range(3):
        result = run_seed(seed, RESHAPE)
        assert result.ok, (seed, result.violations[:2])
        assert [took is not None for _, took in result.reshapes] == [True, True], seed
        assert result.completed == 16 + 24  # every replaced partition read to its seal
        assert result.successor_acquisitions >= 24 + 8


def test_the_layout_that_skips_the_wait_is_caught() -> None:
    kinds = [next(iter(v.kind for v in run_seed(seed, SKIPS).violations), None)
             for seed in range(3)]
    assert kinds == ["reshape-order"] * 3


def test_a_successor_taken_before_its_predecessors_completed_is_a_violation() -> None:
    checker = Checker()
    checker.layout_seen(initial(4).reshape(Uniform(2)))  # 4 and 5 succeed 0-3
    checker.acquired_in_order(1, "a", 1.0)  # no predecessors: never checked
    for p in (0, 1, 2):
        checker.completion_seen(p, 2.0)
    checker.acquired_in_order(4, "a", 3.0)
    assert [(v.kind, v.detail) for v in checker.violations] == [(
        "reshape-order", "partition 4 acquired by a before its predecessors 3 were read to "
        "their seal (completed: 0-2)")]
    checker.completion_seen(3, 4.0)
    checker.acquired_in_order(5, "b", 5.0)
    assert len(checker.violations) == 1 and checker.successor_acquisitions == 2


def test_a_crash_of_a_draining_owner_is_taken_over_and_completes() -> None:
    """Every old partition needs 5 s to its seal; one owner crashes 1 s into the drain and
    returns only after the faults: its partitions are taken over, read again from the
    start and completed by the others; the successors wait for them."""
    world = World(0, quiet(script=(Fault(16.0, "crash", member=0, seconds=60.0,
                                         same_name=False),)))
    result = world.run()
    assert result.ok, result.violations[:2]
    assert result.faults.get("crash") == 1
    assert result.completed == 8 and result.reshapes[0][1] is not None
    took = result.reshapes[0][1]
    # Waited for the takeover: the crash is 1 s into the drain and the owner's last renewal
    # at most one renew interval before it, so its locks run out no sooner than
    # 1 - renew + duration after the reshape began, then 5 s to read them to their seal
    # (13 s; without the wait, 5 s). Since the simulation runs the operator's mark chains
    # seed 0's owner last renews 0.23 s before the reshape, and it takes 15.0 s.
    lease = world.spec.lease
    assert took >= 1.0 - lease.renew_interval_seconds + lease.duration_seconds + 5.0
    layout = world.status()["layout"]
    assert (layout["generation"], layout["states"]) == (2, {"open": "8-19"})


def test_an_empty_sealed_partition_completes_at_once() -> None:
    slow = run_seed(0, quiet())
    empty = run_seed(0, quiet(seal_empty=1.0))
    assert slow.ok and empty.ok, (slow.violations[:1], empty.violations[:1])
    assert empty.completed == slow.completed == 8
    took, waited = empty.reshapes[0][1], slow.reshapes[0][1]
    assert took is not None and waited is not None and took < 5.0 <= waited


def test_apps_that_never_reach_a_seal_are_caught_by_the_reshape_bound() -> None:
    """The check that each reshape ends can fail: with no app reading to its seal
    (``seal_drain`` None) nothing completes and the reshape never ends."""
    result = run_seed(0, quiet(seal_drain=None))
    assert {v.kind for v in result.violations} & {"reshape-end", "liveness"}
    assert result.completed == 0 and result.reshapes[0][1] is None


def test_cli_runs_reshapes_and_names_them_in_the_reproducing_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--reshape", "8,12,4", "--seeds", "1", "--members", "3", "--fault-time", "20"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "--reshape 8,12,4, 3 members, 8 partitions" in out
    assert "reshapes: 2 (0 not ended by the end of the run)" in out
    assert main([*args, "--layout", "skips-the-wait"]) == 1
    out = capsys.readouterr().out
    assert "reshape-order: partition" in out
    assert "--reshape 8,12,4 --layout skips-the-wait --verbose" in out


@pytest.mark.slow  # the seed sweeps: make check runs the fast ones above
def test_reshapes_hold_every_invariant_on_many_seeds_and_the_skipped_wait_is_caught() -> None:
    real = list(run_many(range(SLOW_SEEDS), RESHAPE, jobs=2))
    failed = [(r.seed, r.violations[0]) for r in real if not r.ok]
    assert failed == []
    assert all(took is not None for r in real for _, took in r.reshapes)
    broken = list(run_many(range(SLOW_SEEDS), SKIPS, jobs=2))
    caught = [r.seed for r in broken if "reshape-order" in {v.kind for v in r.violations}]
    assert len(caught) >= 0.9 * SLOW_SEEDS, f"caught on {len(caught)} of {SLOW_SEEDS}"
    assert not any(SAFETY_KINDS & {v.kind for v in r.violations} for r in broken)
