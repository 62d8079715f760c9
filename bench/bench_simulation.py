"""Simulation throughput and convergence times: seeds per second, and how long the group
takes to converge once faults stop (simulated seconds), per configuration.

Run: ``.venv/bin/python bench/bench_simulation.py [--seeds 200] [--start 0]``.
Prints a table; timings depend on the machine's load, the convergence figures do not
(they are a pure function of the seeds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from kgroup_sim import SimConfig, run_seed

CONFIGS: dict[str, SimConfig] = {
    "ci (4 members, 16 partitions, 30 s faults)": SimConfig(
        members=4, partitions=16, fault_time=30),
    "default (5 members, 32 partitions, 60 s faults)": SimConfig(),
    "large (10 members, 128 partitions, 60 s faults)": SimConfig(
        members=10, partitions=128),
}


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--only", default="", help="run the configurations whose name has this")
    args = ap.parse_args()
    header = (f"{'configuration':50} {'seeds':>5} {'seeds/s':>8} {'events':>7} {'writes':>6} "
              f"{'bad':>4} {'conv p50':>8} {'p90':>6} {'p99':>6} {'max':>6} {'bound':>6}")
    print(header)
    print("-" * len(header))
    for name, cfg in CONFIGS.items():
        if args.only not in name:
            continue
        n = args.seeds if "large" not in name else max(1, args.seeds // 5)
        started = time.perf_counter()
        results = [run_seed(s, cfg) for s in range(args.start, args.start + n)]
        wall = time.perf_counter() - started
        conv = [r.converged_after for r in results if r.converged_after is not None]
        bad = sum(1 for r in results if not r.ok)
        print(f"{name:50} {n:5d} {n / wall:8.1f} "
              f"{statistics.mean(r.events for r in results):7.0f} "
              f"{statistics.mean(r.store_writes for r in results):6.0f} {bad:4d} "
              f"{pct(conv, 0.5):8.1f} {pct(conv, 0.9):6.1f} {pct(conv, 0.99):6.1f} "
              f"{max(conv, default=float('nan')):6.1f} "
              f"{statistics.mean(r.bound for r in results):6.1f}")
    print("conv: simulated seconds from the end of faults until the group is converged and "
          "stays so; bound: the mean liveness bound the checker enforces")


if __name__ == "__main__":
    main()
