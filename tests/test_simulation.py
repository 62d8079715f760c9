"""The deterministic simulation (kgroup.sim): many seeds, targeted scenarios, a known
core bug pinned, and proof that the checker fails when the protocol is broken."""

from __future__ import annotations

import pytest

from kgroup.api import ConsumerGroupSpec
from kgroup.core.member import Member
from kgroup.sim import Fault, SimConfig, run_seed
from kgroup.sim.__main__ import main
from kgroup.sim.store import PartitionLeaseObj
from kgroup.sim.variants import NoFencingMember, SameTokenMember
from kgroup.sim.world import FIXES, World

CI_SEEDS = 500
"""Seeds per bulk test (two bulk tests). Measured: the file takes ~60-75 s here."""

SMALL = SimConfig(members=4, partitions=16, fault_time=30, fixes=FIXES)
SAFETY_KINDS = {"safety", "token-order", "sink", "store-token"}
TIMEOUT_BUG = (
    "sidecar bug (kgroup_sidecar.runtime.Sidecar._acquire): an acquisition that timed out "
    "is reported acquire_failed though the API server may have applied it; the lock then "
    "carries the member's own live session, Member.step skips it for ever ('an "
    "acquisition we are about to hear of'), never acknowledges the epoch, and a member "
    "targeted with it waits for ever"
)

VERIFY_BUG = (
    "sidecar bug (kgroup_sidecar.runtime.Sidecar._acquire): the holder re-read compares "
    "the fresh marker with the tracker's *current* marker, not the one the decision was "
    "based on, so a renewal learnt meanwhile (a concurrent verification of the same "
    "holder, or a watch event) makes a live holder's lock look takeable"
)

STALE_RELEASE_BUG = (
    "sidecar bug (kgroup_sidecar.runtime.Sidecar._release + on_list): on_list replaces the "
    "lock cache with a list that may be older than the member's own acquisition; _release "
    "then sees holder != us and reports release_failed(still_ours=False) without writing, "
    "so the lock stays held by the live session, the member forgets it, and the member "
    "targeted with it waits for ever"
)


def spec(**overrides: object) -> ConsumerGroupSpec:
    body: dict[str, object] = {
        "partitions": 8,
        "selector": {"matchLabels": {"app": "sim"}},
        "stabilizationWindowSeconds": 1,
        "stabilizationMaxDelaySeconds": 5,
        "lease": {"durationSeconds": 6, "renewIntervalSeconds": 2},
        "handoff": {"drainTimeoutSeconds": 2},
    }
    body.update(overrides)
    return ConsumerGroupSpec.model_validate(body)


def quiet(**overrides: object) -> SimConfig:
    """No random fault at all; a scenario adds the ones it is about."""
    base: dict[str, object] = dict(
        members=3, partitions=8, fault_time=30.0, kinds=(), event_loss=0.0,
        event_replay=0.0, message_loss=0.0, slow=0.0, ack_never=0.0, spec=spec(),
    )
    base.update(overrides)
    return SimConfig(**base)  # type: ignore[arg-type]


def tokens(world: World) -> dict[int, int]:
    return {o.partition: o.token for o in world.store.objects.values()
            if isinstance(o, PartitionLeaseObj)}


# ---- many seeds -------------------------------------------------------------------------


def test_every_invariant_holds_on_every_seed_with_the_fixed_adapter() -> None:
    """Safety, token order, the fenced sink, store tokens, and liveness (converged within
    the bound, then quiet) on every seed: the real cores, the adapter's fix candidates."""
    failed = []
    for seed in range(CI_SEEDS):
        result = run_seed(seed, SMALL)
        if not result.ok:
            failed.append((seed, result.violations[0]))
    assert failed == [], (
        f"{failed[0]}; reproduce: python -m kgroup.sim --seed {failed[0][0]} --members 4 "
        "--partitions 16 --fault-time 30 --adapter fixed --verbose"
    )


def test_runtime_adapter_keeps_safety_and_fencing_on_every_seed_but_two() -> None:
    """The adapter as kgroup_sidecar runs it today (no fix candidate): safety and fencing
    hold on every seed but the two of the holder re-read bug (127, 363; pinned below);
    liveness is not asserted (it fails on the bugs pinned below)."""
    cfg = SimConfig(members=4, partitions=16, fault_time=30, fixes=frozenset())
    seeds = [s for s in range(CI_SEEDS, CI_SEEDS + CI_SEEDS // 3) if s not in (127, 363)]
    unsafe = [seed for seed in seeds
              if any(v.kind in SAFETY_KINDS for v in run_seed(seed, cfg).violations)]
    assert unsafe == [], f"python -m kgroup.sim --seed {unsafe[0]} --members 4 " \
                         "--partitions 16 --fault-time 30 --verbose"


@pytest.mark.xfail(strict=True, reason=VERIFY_BUG)
def test_holder_reread_as_the_runtime_does_it_keeps_safety() -> None:
    """Seed 363 (all other fix candidates on; 127 and 363 with none): two partitions held
    by one live member are judged takeable on a stale observation; the first verification's
    fresh read updates the tracker's marker, the second compares its identical fresh marker
    with that updated one, sees "no renewal since" and takes a live holder's lock."""
    cfg = SimConfig(members=4, partitions=16, fault_time=30,
                    fixes=FIXES - {"holder-reread"})
    unsafe = [seed for seed in (127, 363)
              if any(v.kind == "safety" for v in run_seed(seed, cfg).violations)]
    assert unsafe == []


@pytest.mark.xfail(strict=True, reason=TIMEOUT_BUG)
def test_timed_out_acquisition_as_the_runtime_handles_it_converges() -> None:
    """Seeds 0, 4 and 6 of the default configuration stall (all other fixes on)."""
    cfg = SimConfig(fixes=FIXES - {"acquire-timeout"})
    assert [seed for seed in range(10) if not run_seed(seed, cfg).ok] == []


@pytest.mark.xfail(strict=True, reason=STALE_RELEASE_BUG)
def test_release_on_a_stale_cache_as_the_runtime_does_it_converges() -> None:
    """Seeds 1376 and 2316 (all other fixes on): a re-list read before the member's own
    acquisition is delivered after it (and the acquisition's watch event is lost), the
    release then finds the cache says 'not ours' and gives the lock up unwritten."""
    cfg = SimConfig(members=4, partitions=16, fault_time=30,
                    fixes=FIXES - {"release-stale-cache"})
    assert [seed for seed in (1376, 2316) if not run_seed(seed, cfg).ok] == []


def test_a_seed_replays_exactly() -> None:
    cfg = SimConfig(members=3, partitions=8, fault_time=20, verbose=True)
    first, again = World(11, cfg).run(), World(11, cfg).run()
    assert len(first.trace) > 100 and first.trace == again.trace
    assert (first.events, first.store_writes, first.faults, first.violations) == (
        again.events, again.store_writes, again.faults, again.violations)


def test_a_seed_replays_exactly_in_another_process_with_another_hash_seed() -> None:
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "kgroup.sim", "--seed", "5", "--members", "3",
           "--partitions", "8", "--fault-time", "10", "--verbose"]
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        outs.append([line for line in done.stdout.splitlines()
                     if not line.startswith("wall time")])
    assert len(outs[0]) > 100 and outs[0] == outs[1]


# ---- targeted scenarios -----------------------------------------------------------------


def test_gc_pause_longer_than_the_lease_fences_the_member_and_the_sink_refuses_its_writes(
) -> None:
    cfg = quiet(script=(Fault(12.0, "gc-pause", member=0, seconds=15.0),))
    world = World(1, cfg)
    result = world.run()
    assert result.ok, result.violations
    assert result.faults.get("gc-pause>lease") == 1
    m01 = world.sidecars["m01"].member
    assert m01.fence_count == 1  # it found itself fenced on resume, then started anew
    # the writes it had in flight when frozen landed after the new owners opened the sink
    # with higher tokens, and were refused
    assert world.checker.sink_refused >= 1
    assert result.converged_after is not None
    final = world.epochs[-1][2]
    assert sorted(final) == ["m01", "m02", "m03"] and final["m01"] != ""


def test_operator_restart_mid_rebalance_moves_nothing_and_bumps_no_epoch() -> None:
    cfg = quiet(script=(Fault(10.0, "join"), Fault(11.5, "operator-restart", seconds=3.0)))
    world = World(2, cfg)
    result = world.run()
    assert result.ok, result.violations
    assert result.faults.get("operator-restart") == 1
    before = [(t, e, a) for t, e, a in world.epochs if t < 11.5]
    after = [(t, e, a) for t, e, a in world.epochs if t >= 11.5]
    assert "m04" in before[-1][2], "the rebalance for the joiner started before the restart"
    assert after == [], "the restarted operator read the target back and changed nothing"
    assert result.converged_after is not None


def test_lost_watch_events_are_recovered_by_relists() -> None:
    cfg = quiet(event_loss=0.3, fault_time=40.0,
                script=(Fault(10.0, "join"), Fault(20.0, "leave", member=0)))
    world = World(3, cfg)
    result = world.run()
    assert result.ok, result.violations
    assert result.faults.get("lost-event", 0) >= 50
    assert sorted(world.epochs[-1][2]) == ["m02", "m03", "m04"]
    assert result.converged_after is not None


def test_member_crashing_and_returning_under_its_name_within_grace_keeps_its_partitions(
) -> None:
    crash = Fault(10.0, "crash", member=1, seconds=4.0, same_name=True)
    base = World(4, quiet(spec=spec(restartGraceSeconds=20)))
    crashed = World(4, quiet(spec=spec(restartGraceSeconds=20), script=(crash,)))
    r_base, r_crashed = base.run(), crashed.run()
    assert r_base.ok and r_crashed.ok, r_crashed.violations
    assert r_crashed.faults.get("crash") == 1
    assert [e for t, e, _ in crashed.epochs if t >= 10.0] == [], "no rebalance"
    target = base.epochs[-1][2]
    assert crashed.epochs[-1][2] == target
    mine = {p for p, m in _owners(target).items() if m == "m02"}
    assert mine, "m02 had partitions"
    expected = {p: t + (1 if p in mine else 0) for p, t in tokens(base).items()}
    assert tokens(crashed) == expected, "only m02's partitions moved: to its new session"


@pytest.mark.xfail(strict=True, reason=(
    "sidecar bug (kgroup_sidecar.runtime + settings): with the default lease 15 s / renew "
    "5 s, a renewal whose answer is lost times out after 0.4 x 15 = 6 s, is retried 1 s "
    "later, i.e. at last_renew_sent + 12 s = the fencing deadline: one lost answer fences "
    "the member, pausing every partition it holds until its new session re-acquires them"))
def test_one_lost_renewal_answer_does_not_fence_a_member_with_the_default_lease() -> None:
    cfg = quiet(spec=spec(lease={"durationSeconds": 15, "renewIntervalSeconds": 5}),
                script=(Fault(20.0, "lose-answer", member=0),))
    world = World(0, cfg)
    result = world.run()
    assert result.ok, result.violations
    assert world.sidecars["m01"].member.fence_count == 0


@pytest.mark.xfail(strict=True, reason=(
    "design gap (kgroup.core.member + kgroup_sidecar.runtime._set_group): a status without "
    "an epoch (restored without status, or emptied) becomes target None, which Member.step "
    "treats as 'nothing targeted' and revokes every partition before the restarted operator "
    "can seed the target from the lock holders, so every partition pauses and moves "
    "(docs promise: an empty status is seeded from the holders, moving nothing)"))
def test_status_emptied_under_running_members_is_reseeded_without_moving_anything() -> None:
    base = World(0, quiet())
    reset = World(0, quiet(script=(Fault(12.0, "status-reset", seconds=2.0),)))
    r_base, r_reset = base.run(), reset.run()
    assert r_base.ok and r_reset.ok, r_reset.violations
    assert r_reset.faults.get("status-reset") == 1
    assert tokens(reset) == tokens(base), "no partition changed hands"


def _owners(target: dict[str, str]) -> dict[int, str]:
    from kgroup.core.ranges import parse_ranges

    return {p: m for m, r in target.items() for p in parse_ranges(r)}


# ---- the checker can fail ---------------------------------------------------------------


def test_checker_catches_a_member_that_ignores_its_fencing_deadline() -> None:
    cfg = SimConfig(members=3, partitions=8, fault_time=30, kinds=(),
                    script=(Fault(10.0, "gc-pause", member=0, seconds=15.0),),
                    member_factory=NoFencingMember)
    caught = [seed for seed in range(5)
              if any(v.kind == "safety" for v in run_seed(seed, cfg).violations)]
    assert caught, "a member that never fences must be caught by the safety invariant"
    real = SimConfig(**{**cfg.__dict__, "member_factory": Member})
    assert not [v for v in run_seed(caught[0], real).violations if v.kind in SAFETY_KINDS]


def test_checker_catches_a_member_that_does_not_raise_the_token() -> None:
    result = run_seed(0, SimConfig(members=3, partitions=8, fault_time=20,
                                   member_factory=SameTokenMember))
    assert {"store-token"} <= {v.kind for v in result.violations}


# ---- the command line -------------------------------------------------------------------


def test_cli_summarises_and_exits_zero_when_every_seed_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--seeds", "2", "--members", "3", "--partitions", "8", "--fault-time", "15",
                 "--adapter", "fixed"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "seeds run: 2" in out and "violations: 0 seeds" in out and "faults injected:" in out


def test_cli_exits_one_and_prints_the_reproducing_command_on_a_violation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--seeds", "1", "--start", "7", "--members", "3", "--partitions", "8",
                 "--fault-time", "15", "--variant", "same-token"])
    out = capsys.readouterr().out
    assert code == 1
    assert "VIOLATION seed=7 step=" in out
    assert "reproduce: python -m kgroup.sim --seed 7 --members 3 --partitions 8" in out
