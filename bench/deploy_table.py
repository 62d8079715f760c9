"""The deploy and default-settings tables of docs/benchmarks.md, from the benchmarks' JSON.

    .venv/bin/python bench/deploy_table.py --label "before (main at 099f553)" \\
        --real-node docs/bench/real_node_before.json \\
        --rebalance docs/bench/rebalance_defaults_before.json

prints Markdown (p50 / p95 of each figure, n runs) to paste under that label.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage import pct

from kgroup.core.objects import Obj


def fmt(xs: list[float], unit: str = "", digits: int = 2) -> str:
    if not xs:
        return "-"
    return (f"{pct(xs, 0.5):.{digits}f}{unit} / {pct(xs, 0.95):.{digits}f}{unit} "
            f"(n={len(xs)})")


def real_node_table(data: Obj) -> list[str]:
    rows = ["| workers x partitions | moves ÷ partitions | most unowned at once | "
            "longest pause | rollout duration | epochs | verifier |",
            "|---|---|---|---|---|---|---|"]
    for size in data["sizes"]:
        rolls = size["rollout"]
        v = size["verifier"]
        clean = (f"clean ({v['produced']} events)" if v["clean"] and not size["violations"]
                 else f"NOT clean: lost {v['lost']}, dup {v['duplicated']}, "
                      f"{len(size['violations'])} overlaps")
        rows.append(
            f"| {size['kind']} {size['workers']} x {size['partitions']} "
            f"| {fmt([r['moves_per_partition'] for r in rolls])} "
            f"| {fmt([r['max_unowned'] for r in rolls], digits=0)} "
            f"| {fmt([r['longest_pause_s'] for r in rolls], ' s', 1)} "
            f"| {fmt([r['duration_s'] for r in rolls], ' s', 0)} "
            f"| {fmt([r.get('epochs', float('nan')) for r in rolls], digits=0)} | {clean} |")
    return rows


def rebalance_table(data: Obj) -> list[str]:
    rows = ["| settings | join | graceful leave | node loss (SIGKILL) | burst of 10 joins "
            "in 3 s | burst epochs | burst moves - bound | 10 leave at once | safety |",
            "|---|---|---|---|---|---|---|---|---|"]
    for run in data["runs"]:
        spec = run["group_spec"]
        label = (f"{run['settings']} (window {spec['stabilizationWindowSeconds']} s, lease "
                 f"{spec['lease']['durationSeconds']} / {spec['lease']['renewIntervalSeconds']}"
                 " s)")
        bursts = run.get("bursts", [])
        rows.append(
            f"| {label} | {fmt(run['joins'], ' s')} | {fmt(run['leaves'], ' s')} "
            f"| {fmt(run['crashes'], ' s', 1)} | {fmt([b['seconds'] for b in bursts], ' s')} "
            f"| {', '.join(str(b['epochs']) for b in bursts) or '-'} "
            f"| {', '.join(str(b['moved'] - b['lower_bound']) for b in bursts) or '-'} "
            f"| {fmt([b['leave_seconds'] for b in bursts], ' s')} "
            f"| {run['safety_violations']} overlaps |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    ap.add_argument("--label", default="")
    ap.add_argument("--real-node", type=Path)
    ap.add_argument("--rebalance", type=Path)
    args = ap.parse_args()
    out: list[str] = [f"**{args.label}**", ""] if args.label else []
    for path, table in ((args.rebalance, rebalance_table), (args.real_node, real_node_table)):
        if path is not None:
            data = json.loads(path.read_text())
            load = data.get("machine", {}).get("load_average")
            out += [f"`{data.get('command', path.name)}` (load average at the start: {load})",
                    "", *table(data), ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
