"""``python -m kgroup_sim``: run many seeds, print a summary, exit 1 on any violation.

Examples::

    python -m kgroup_sim --seeds 2000              # seeds 0..1999
    python -m kgroup_sim --seed 1234 --verbose     # replay one seed's trace
    python -m kgroup_sim --seed 10 --members 4 --partitions 16 --fault-time 30 \
        --variant no-adoption --regression acquire-timeout-fails  # old bugs, put back
    python -m kgroup_sim --reshape 16,24,8 --seeds 200    # spec.partitions 16 -> 24 -> 8
    python -m kgroup_sim --reshape 16,24,8 --layout skips-the-wait --seeds 20  # caught
    python -m kgroup_sim --load zipf --load-noise 0.2 --load-shift 60 --settle 150 \
        --window 240 --window-moves -1 --window-rebalances 2 --members 4 \
        --partitions 16 --fault-time 30 --seeds 500 --jobs 2
        # spec.balance.mode load under a skewed, noisy, shifting load: the rebalances stop
    python -m kgroup_sim --load zipf --load-noise 0.2 --load-shift 60 \
        --window-rebalances 2 --window-moves -1 --balance no-hysteresis --seeds 20
        # the balance without hysteresis: caught oscillating
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

from kgroup.core.member.reconcile import Member
from kgroup.core.operator.decide import ExpiryRule
from kgroup.core.operator.load_window import LOAD_WINDOW_REPORTS
from kgroup.core.operator.reshape import Layout
from kgroup_sim.checks import OscillationCheck
from kgroup_sim.load import ZipfLoad
from kgroup_sim.variants import (
    BALANCES,
    LOAD_WINDOWS,
    REGRESSIONS,
    EarlyExpiry,
    MarkerCompareExpiry,
    NoAdoptionMember,
    NoFencingMember,
    NoMarkMember,
    NoRereadExpiry,
    NoTargetRevokesMember,
    SameTokenMember,
    SkipsTheWait,
)
from kgroup_sim.world import Result, SimConfig, run_seed

VARIANTS = {
    "real": Member,
    "no-adoption": NoAdoptionMember,
    "no-fencing": NoFencingMember,
    "no-mark": NoMarkMember,
    "no-target-revokes": NoTargetRevokesMember,
    "same-token": SameTokenMember,
}

DETECTORS: dict[str, type[ExpiryRule]] = {
    "real": ExpiryRule,
    "no-reread": NoRereadExpiry,
    "early": EarlyExpiry,
    "marker-compare": MarkerCompareExpiry,
}
"""The operator's failure detector: the shipped rule or a broken variant of it."""

LAYOUTS: dict[str, type[Layout]] = {
    "real": Layout,
    "skips-the-wait": SkipsTheWait,
}
"""The operator's layout (which partitions a reshape lets it assign): the shipped rule or
a broken variant of it."""

SEAL_DRAIN = (0.5, 8.0)
"""With ``--reshape``: each sealed partition's backlog, simulated seconds (a quarter of
them empty), read by its owner before it completes the partition."""


def sizes(text: str) -> tuple[int, ...]:
    """``16,24,8`` -> (16, 24, 8): the first is the group's size, then each reshape's."""
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of sizes: {text!r}") from None
    if len(out) < 2 or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected at least two sizes >= 1: {text!r}")
    return out


def config_from(args: argparse.Namespace) -> SimConfig:
    """The run's configuration (``--reshape N,...`` sets ``--partitions`` to N)."""
    reshape: tuple[int, ...] = ()
    if args.reshape:
        args.partitions, reshape = args.reshape[0], args.reshape[1:]
    on = bool(args.load)
    return SimConfig(members=args.members, partitions=args.partitions, reshape=reshape,
                     seal_drain=SEAL_DRAIN if reshape else None, layout=LAYOUTS[args.layout],
                     fault_time=args.fault_time, member_factory=VARIANTS[args.variant],
                     regressions=frozenset(args.regression), verbose=args.verbose,
                     scoped_watch=not args.whole_watch,
                     expiry_rule=DETECTORS[args.detector],
                     expiry_admission=not args.no_expiry_admission,
                     load=ZipfLoad(s=args.load_skew, noise=args.load_noise,
                                   shift_at=args.load_shift) if on else None,
                     balance=BALANCES[args.balance] if on else None,
                     load_window=LOAD_WINDOWS.get(args.balance, LOAD_WINDOW_REPORTS),
                     oscillation=OscillationCheck(
                         settle=args.settle, window=args.window,
                         max_moves=None if args.window_moves < 0 else args.window_moves,
                         max_rebalances=args.window_rebalances,
                         late_above=args.late_above)
                     if on else None)


def load_flags(args: argparse.Namespace) -> str:
    if not args.load:
        return ""
    flags = f" --load {args.load} --load-skew {args.load_skew:g} --load-noise {args.load_noise:g}"
    if args.load_shift is not None:
        flags += f" --load-shift {args.load_shift:g}"
    flags += (f" --balance {args.balance} --settle {args.settle:g} --window "
              f"{args.window:g} --window-moves {args.window_moves}")
    if args.window_rebalances is not None:
        flags += f" --window-rebalances {args.window_rebalances}"
    if args.late_above is not None:
        flags += f" --late-above {args.late_above:g}"
    return flags


def adapter_flags(args: argparse.Namespace) -> str:
    flags = "".join(f" --regression {name}" for name in sorted(set(args.regression)))
    if args.detector != "real":
        flags += f" --detector {args.detector}"
    if args.no_expiry_admission:
        flags += " --no-expiry-admission"
    if args.reshape:
        flags += " --reshape " + ",".join(map(str, args.reshape))
    if args.layout != "real":
        flags += f" --layout {args.layout}"
    return flags + (" --whole-watch" if args.whole_watch else "")


def _run(job: tuple[int, SimConfig]) -> Result:
    return run_seed(*job)


def run_many(seeds: Sequence[int], cfg: SimConfig, jobs: int = 1) -> Iterator[Result]:
    """Results in seed order; ``jobs`` > 1 runs them in that many processes."""
    work = [(s, cfg) for s in seeds]
    if jobs <= 1:
        yield from map(_run, work)
        return
    with ProcessPoolExecutor(jobs) as pool:
        yield from pool.map(_run, work, chunksize=8)


def repro(args: argparse.Namespace, seed: int) -> str:
    return (f"python -m kgroup_sim --seed {seed} --members {args.members} "
            f"--partitions {args.partitions} --fault-time {args.fault_time:g} "
            f"--variant {args.variant}{adapter_flags(args)}{load_flags(args)} --verbose")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kgroup_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200, help="how many seeds to run")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, default=None, help="run this one seed only")
    ap.add_argument("--members", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--fault-time", type=float, default=60.0,
                    help="simulated seconds of faults before the convergence phase")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="real",
                    help="member state machine: the real core or a deliberately broken one")
    ap.add_argument("--detector", choices=sorted(DETECTORS), default="real",
                    help="the operator's failure detector: the shipped rule or a broken "
                         "variant (kgroup_sim.variants)")
    ap.add_argument("--no-expiry-admission", action="store_true",
                    help="the store does not refuse a takeover without the expiry mark "
                         "(the admission policy off: the sidecar's rule alone)")
    ap.add_argument("--regression", action="append", default=[], choices=sorted(REGRESSIONS),
                    help="bring back this old bug of the sidecar's decision code (a subclass "
                         "of the shipped SidecarLogic, kgroup_sim.variants; repeatable)")
    ap.add_argument("--reshape", type=sizes, default=None, metavar="N,M[,...]",
                    help="spec.partitions changed from N (overrides --partitions) to M and "
                         "on, at times drawn from the seed during the faults; apps read "
                         "sealed partitions to their seal and complete them")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="real",
                    help="the operator's layout rule: the shipped one, or a broken variant "
                         "that assigns successors at once (kgroup_sim.variants)")
    ap.add_argument("--whole-watch", action="store_true",
                    help="sidecars watch every Lease of the group (not their scope)")
    ap.add_argument("--load", choices=["zipf"], default=None,
                    help="the apps report skewed load on their renewals and the group runs "
                         "spec.balance.mode load; the run then checks that load rebalances "
                         "stop (--settle, --window)")
    ap.add_argument("--load-skew", type=float, default=0.8,
                    help="the Zipf exponent s of the rates (1/rank**s, placed at random)")
    ap.add_argument("--load-noise", type=float, default=0.0,
                    help="each reported rate times a uniform factor in [1-x, 1+x], drawn "
                         "at every renewal")
    ap.add_argument("--load-shift", type=float, default=None,
                    help="at this simulated second the hot set moves (a new random "
                         "placement of the same rates)")
    ap.add_argument("--balance", choices=sorted(BALANCES), default="real",
                    help="spec.balance: the planner's defaults, or a broken setting "
                         "(kgroup_sim.variants.BALANCES)")
    ap.add_argument("--settle", type=float, default=180.0,
                    help="simulated seconds after the faults and the shift before the window")
    ap.add_argument("--window", type=float, default=300.0,
                    help="simulated seconds in which load rebalances must stay within "
                         "--window-moves and --window-rebalances")
    ap.add_argument("--window-moves", type=int, default=0,
                    help="the most partitions load rebalances may move in the window "
                         "(-1: no bound)")
    ap.add_argument("--window-rebalances", type=int, default=None,
                    help="the most changes of target that move any in the window "
                         "(default: no bound)")
    ap.add_argument("--late-above", type=float, default=None,
                    help="a window move from a target whose busiest member was above this "
                         "times the mean on the true rates is late settling, counted apart "
                         "and not bounded (e.g. 1.2, the shipped trigger; default: every "
                         "move bounded)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--verbose", action="store_true", help="print the trace of each seed")
    args = ap.parse_args(argv)
    if not args.load and (args.balance != "real" or args.load_shift is not None
                          or args.load_noise):
        ap.error("--balance, --load-shift and --load-noise need --load")
    seeds = [args.seed] if args.seed is not None else list(
        range(args.start, args.start + args.seeds))
    cfg = config_from(args)
    started = time.perf_counter()
    faults: dict[str, int] = {}
    failed: list[Result] = []
    sink = [0, 0]
    slowest: tuple[float, int] = (0.0, -1)
    reshape_ends: list[float] = []
    unended = completed = successors = 0
    done: list[Result] = []
    for result in run_many(seeds, cfg, 1 if args.verbose else args.jobs):
        if args.load:
            result.trace = []
            done.append(result)
        if args.verbose:
            print(f"# seed {result.seed}: {result.spec}")
            print("\n".join(result.trace))
        sink[0] += result.sink_accepted
        completed += result.completed
        successors += result.successor_acquisitions
        for _, took in result.reshapes:
            if took is None:
                unended += 1
            else:
                reshape_ends.append(took)
        sink[1] += result.sink_refused
        for kind, n in result.faults.items():
            faults[kind] = faults.get(kind, 0) + n
        if result.converged_after is not None and result.converged_after >= slowest[0]:
            slowest = (result.converged_after, result.seed)
        if not result.ok:
            failed.append(result)
            for v in result.violations[:3]:
                print(f"VIOLATION seed={result.seed} step={v.step} t={v.time:.3f} {v.kind}: "
                      f"{v.detail}")
            print(f"  reproduce: {repro(args, result.seed)}")
    wall = time.perf_counter() - started
    adapter = adapter_flags(args).strip() or "the shipped decision code"
    print(f"seeds run: {len(seeds)} (variant {args.variant}, {adapter}, "
          f"{args.members} members, "
          f"{args.partitions} partitions, {args.fault_time:g}s of faults)")
    outcomes = {"epoch-bump", "fence", "lost"}
    print("faults injected: " + ", ".join(
        f"{k}={v}" for k, v in sorted(faults.items()) if k not in outcomes))
    print("outcomes: " + ", ".join(
        f"{k}={v}" for k, v in sorted(faults.items()) if k in outcomes)
        + " (fence: a member fenced itself; lost: a member saw a lock it still held taken "
          "by another session, which a correct run never shows)")
    print(f"fenced sink: {sink[0]} app writes accepted, {sink[1]} stale-token writes refused")
    if args.reshape:
        ends = sorted(reshape_ends)
        settled = (f"p50 {ends[len(ends) // 2]:.1f} s, max {ends[-1]:.1f} s" if ends
                   else "n/a")
        print(f"reshapes: {len(ends) + unended} ({unended} not ended by the end of the run); "
              f"from the spec change to the layout settled {settled}; {completed} partitions "
              f"completed, {successors} successor acquisitions")
    by_kind: dict[str, int] = {}
    for r in failed:
        for v in r.violations[:1]:
            by_kind[v.kind] = by_kind.get(v.kind, 0) + 1
    print(f"violations: {len(failed)} seeds"
          + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(by_kind.items())) + ")"
             if by_kind else ""))
    if slowest[1] >= 0:
        print(f"slowest convergence: {slowest[0]:.1f} simulated s (seed {slowest[1]})")
    else:
        print("slowest convergence: n/a (no seed converged)")
    if args.load:
        print_load(done, args)
    print(f"wall time: {wall:.1f}s ({len(seeds) / wall:.1f} seeds/s)")
    return 1 if failed else 0


def _spread(values: Sequence[float], fmt: str = "g") -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"median {statistics.median(ordered):{fmt}}, p99 {p99:{fmt}}, "
            f"max {ordered[-1]:{fmt}}")


def print_load(results: Sequence[Result], args: argparse.Namespace) -> None:
    """The load figures of a --load run: moves, their end, the oscillation window."""
    shift = f", hot set shifted at {args.load_shift:g}s" if args.load_shift is not None else ""
    print(f"load: zipf s={args.load_skew:g}, noise +-{args.load_noise:g} per renewal{shift}; "
          f"balance {args.balance}")
    print(f"partitions moved after the faults{' and the shift' if shift else ''} "
          f"(per seed): {_spread([r.moves for r in results])}; rebalances: "
          f"{_spread([r.rebalances for r in results])}")
    print("last move (simulated s after that start): "
          + _spread([r.last_move_after for r in results if r.last_move_after is not None],
                    ".1f"))
    window = [r.window_moves for r in results if r.window_moves is not None]
    print(f"moved in the window [{args.settle:g}, {args.settle + args.window:g}] s after it: "
          f"{sum(1 for w in window if w)} of {len(window)} seeds moved any, "
          f"{sum(window)} partitions in all, {_spread(window)} per seed")
    late = [r.late_moves for r in results if r.late_moves is not None]
    if args.late_above is not None and late:
        print(f"  of which late settling (from above {args.late_above:g}x on the true "
              f"rates): {sum(1 for x in late if x)} seeds, {sum(late)} partitions; noise "
              f"moves: {sum(1 for w, x in zip(window, late, strict=False) if w - x)} seeds, "
              f"{sum(window) - sum(late)} partitions")
    busiest = [r.busiest for r in results if r.busiest is not None]
    above = sum(1 for r in results if r.busiest is not None and r.load_bound is not None
                and r.busiest > max(1.2, r.load_bound) + 1e-9)
    print(f"final busiest / mean (true rates): {_spread(busiest, '.3f')}; load_bound "
          f"{_spread([r.load_bound for r in results if r.load_bound is not None], '.3f')}; "
          f"above max(1.2, bound): {above} seeds")


if __name__ == "__main__":
    sys.exit(main())
