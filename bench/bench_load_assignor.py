"""Load-aware sticky assignment on skewed load: balance reached, moves spent, noise ignored.

Pure and quick (no cluster): Zipf loads (``1/rank**s``, s = 0.8 by default) placed at
random on 64 partitions over 8 members, one run per seed. For each run, starting from the
count-based sticky assignment:

- ``count``: busiest member / mean under count-based balance;
- ``bound``: :func:`load_bound`, the best any assignment can do;
- ``settled``: busiest / mean after 10 simulated minutes of stable load, one plan every
  20 s; ``moves``: partitions moved meanwhile; ``min_req``: the fewest moves any planner
  needs to get busiest / mean <= max(1 + tolerance, bound) (:func:`min_moves_lower_bound`,
  a lower bound), ``min_same``: the same for reaching our ``settled`` ratio;
- ``noisy``: moves during the next 10 minutes with every partition's rate times a fresh
  uniform factor in [0.8, 1.2] every 20 s (``broken_noisy``: the same with band 0,
  margin 0, dwell 0);
- ``shift``: the hot set re-drawn, then 10 minutes: moves, plans that moved, and the ratio.

Medians (and maxima where a bound matters) over the runs; the last line is one JSON object.

    .venv/bin/python bench/bench_load_assignor.py [--runs 50] [--partitions 64] [--members 8]

docs/load-balancing.md quotes ``--runs 200`` (about 30 s of CPU; 50 runs take a few).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from typing import Any

from kgroup.core.operator.assignors import Assignee
from kgroup.core.operator.load_balance import (
    LoadBalance,
    busiest_ratio,
    load_bound,
    min_moves_lower_bound,
)
from kgroup_sim.load import Balancer, jitter, zipf_loads

MINUTES_10 = 600.0
NO_HYSTERESIS = LoadBalance(tolerance=0.0, margin=0.0, dwell_seconds=0.0)


def one_run(seed: int, partitions: int, n_members: int, s: float, noise: float) -> dict[str, Any]:
    rng = random.Random(seed)
    members = [Assignee(f"worker-{i}") for i in range(n_members)]
    loads = zipf_loads(partitions, s, rng)
    bal = Balancer(partitions, members)
    start = dict(bal.target)
    cfg = bal.config
    bound = load_bound(loads, members)
    count = busiest_ratio(start, loads, members)

    moves = bal.run(lambda _t: loads, MINUTES_10)
    settled = busiest_ratio(bal.target, loads, members)
    min_req = min_moves_lower_bound(start, loads, members, max(1 + cfg.tolerance, bound))
    min_same = min_moves_lower_bound(start, loads, members, settled)
    settled_target = dict(bal.target)

    noise_rng = random.Random(seed + 1_000_003)
    noisy = bal.run(lambda _t: jitter(loads, noise, noise_rng), MINUTES_10)

    broken = Balancer(partitions, members, NO_HYSTERESIS, target=settled_target)
    broken.now = bal.now
    noise_rng = random.Random(seed + 1_000_003)
    broken_noisy = broken.run(lambda _t: jitter(loads, noise, noise_rng), MINUTES_10)

    shifted = zipf_loads(partitions, s, rng)
    plans_before = bal.plans_that_moved
    shift_moves = bal.run(lambda _t: shifted, MINUTES_10)
    return {
        "count": count,
        "bound": bound,
        "settled": settled,
        "moves": moves,
        "min_req": min_req,
        "min_same": min_same,
        "noisy": noisy,
        "broken_noisy": broken_noisy,
        "shift_moves": shift_moves,
        "shift_plans": bal.plans_that_moved - plans_before,
        "shift_settled": busiest_ratio(bal.target, shifted, members),
        "shift_bound": load_bound(shifted, members),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--zipf", type=float, default=0.8)
    parser.add_argument("--noise", type=float, default=0.2)
    args = parser.parse_args()
    runs = [
        one_run(seed, args.partitions, args.members, args.zipf, args.noise)
        for seed in range(args.runs)
    ]

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    over = [r for r in runs if r["settled"] > max(1 + LoadBalance().tolerance, r["bound"]) + 1e-9]
    summary = {
        "partitions": args.partitions,
        "members": args.members,
        "zipf_s": args.zipf,
        "noise": args.noise,
        "runs": args.runs,
        "count_busiest_over_mean_median": round(med("count"), 3),
        "load_busiest_over_mean_median": round(med("settled"), 3),
        "load_busiest_over_mean_max": round(max(r["settled"] for r in runs), 3),
        "bound_median": round(med("bound"), 3),
        "runs_above_max_1.15_bound": len(over),
        "moves_to_settle_median": med("moves"),
        "moves_to_settle_max": max(r["moves"] for r in runs),
        "min_moves_for_requirement_median": med("min_req"),
        "moves_over_min_for_requirement_median": round(
            statistics.median(r["moves"] / max(1, r["min_req"]) for r in runs), 2
        ),
        "moves_over_min_for_same_ratio_median": round(
            statistics.median(r["moves"] / max(1, r["min_same"]) for r in runs), 2
        ),
        "noisy_10min_moves_total": sum(r["noisy"] for r in runs),
        "noisy_10min_runs_with_moves": sum(1 for r in runs if r["noisy"]),
        "broken_noisy_10min_moves_median": med("broken_noisy"),
        "shift_moves_median": med("shift_moves"),
        "shift_plans_that_moved_max": max(r["shift_plans"] for r in runs),
        "shift_busiest_over_mean_max": round(max(r["shift_settled"] for r in runs), 3),
    }
    print(
        f"{args.runs} runs, Zipf s={args.zipf}, {args.partitions} partitions, "
        f"{args.members} members, noise ±{args.noise:.0%} every 20 s"
    )
    print(f"  busiest/mean, count-based (median):   {summary['count_busiest_over_mean_median']}")
    print(
        f"  busiest/mean, load-aware (median/max): {summary['load_busiest_over_mean_median']}"
        f" / {summary['load_busiest_over_mean_max']}   bound (median): "
        f"{summary['bound_median']}   runs above max(1.15, bound): {len(over)}"
    )
    print(
        f"  moves to settle (median/max): {summary['moves_to_settle_median']} / "
        f"{summary['moves_to_settle_max']}; over the minimum for max(1.15, bound): "
        f"{summary['moves_over_min_for_requirement_median']}x, over the minimum for the "
        f"same ratio: {summary['moves_over_min_for_same_ratio_median']}x"
    )
    print(
        f"  10 min of noisy load: {summary['noisy_10min_moves_total']} moves in all, "
        f"{summary['noisy_10min_runs_with_moves']} runs moved; without hysteresis: "
        f"median {summary['broken_noisy_10min_moves_median']} moves per run"
    )
    print(
        f"  hot set re-drawn: median {summary['shift_moves_median']} moves, at most "
        f"{summary['shift_plans_that_moved_max']} plans moved, busiest/mean max "
        f"{summary['shift_busiest_over_mean_max']}"
    )
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
