"""Assignor speed at operator scale: initial assignment, one join, one leave.

Rule: timings live here, never in tests. Prints a table and writes
docs/bench/assignor.json. Each case runs ``--repeat`` times (default 7); median and max
wall time per call are reported in milliseconds, together with the partitions moved and
the lower bound (sticky should equal it; range shows what contiguity costs).

    .venv/bin/python bench/bench_assignor.py [--repeat 7] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kgroup.core.operator.assignors import (
    Assignee,
    get_assignor,
    lower_bound_moves,
    moved_partitions,
)

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "assignor.json"
SIZES = [(10_000, 200), (50_000, 1_000), (100_000, 1_000)]


def timed(fn: Callable[[], dict[str, list[int]]], repeat: int) -> tuple[list[float], Any]:
    times: list[float] = []
    result: Any = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return times, result


def bench(name: str, partitions: int, n_members: int, repeat: int) -> list[dict[str, Any]]:
    assignor = get_assignor(name)
    members = [Assignee(f"worker-{i:05d}") for i in range(n_members)]
    stable = assignor.assign(partitions, members, {}, {})
    joined = [*members, Assignee("worker-joiner")]
    left = [m for i, m in enumerate(members) if i != n_members // 2]
    cases: list[tuple[str, list[Assignee], dict[str, list[int]]]] = [
        ("initial", members, {}),
        ("join", joined, stable),
        ("leave", left, stable),
    ]
    rows = []
    for case, ms, current in cases:

        def call(ms: list[Assignee] = ms,
                 c: dict[str, list[int]] = current) -> dict[str, list[int]]:
            return assignor.assign(partitions, ms, c, {})

        times, result = timed(call, repeat)
        rows.append(
            {
                "assignor": name,
                "partitions": partitions,
                "members": n_members,
                "case": case,
                "repeat": repeat,
                "median_ms": round(statistics.median(times), 3),
                "max_ms": round(max(times), 3),
                "moved": moved_partitions(current, result),
                "lower_bound": lower_bound_moves(partitions, ms, current, {}),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smallest size only, no JSON")
    args = parser.parse_args(argv)
    if args.repeat < 5:
        parser.error("--repeat must be at least 5")
    sizes = SIZES[:1] if args.quick else SIZES
    rows = [r for n, m in sizes for a in ("sticky", "range") for r in bench(a, n, m, args.repeat)]
    head = f"{'assignor':8} {'partitions':>10} {'members':>7} {'case':8} {'median ms':>10} "
    head += f"{'max ms':>9} {'moved':>7} {'lower bound':>11}"
    print(head)
    for r in rows:
        print(
            f"{r['assignor']:8} {r['partitions']:>10} {r['members']:>7} {r['case']:8} "
            f"{r['median_ms']:>10.2f} {r['max_ms']:>9.2f} {r['moved']:>7} {r['lower_bound']:>11}"
        )
    if not args.quick:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "command": "python bench/bench_assignor.py",
        }
        OUT.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
