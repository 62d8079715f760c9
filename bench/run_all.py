"""``make bench``: every benchmark, then docs/bench/results.json, table.md and the plots.

Rule: one entry point that brings the local cluster up if needed, runs each section, and
merges its figures into ``docs/bench/results.json`` (a section not run keeps its last
figures, with the machine and command they were measured with). ``table.md`` and the PNGs
are rendered from that file, never from memory, so they always agree with it.

    .venv/bin/python bench/run_all.py [--only rebalance,rebalance_large,scale,assignor,pipeline]
        [--quick] [--render-only]

Sections: rebalance (64 partitions, 4 -> 5 sidecar processes; 20 joins, 10 leaves,
10 crashes), rebalance_large (1,024 x 32, swarm), scale (10,000 x 200 and the comparison
sizes, 4 swarm processes), assignor (pure), pipeline (PySpark + light worker vs raw XRANGE).
Chaos is apart: ``bench/chaos.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_assignor
import bench_rebalance
import bench_scale
from stage import cluster, machine, pct

from kgroup.core.objects import Obj

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "bench"
RESULTS = OUT / "results.json"
KAFKA_UNIFORM_MS = (15, 20)  # KIP-848, broker-side uniform assignor, 50,000 x 1,000 (Java)


def rebalance(quick: bool) -> Obj:
    rounds, crashes = (3, 1) if quick else (20, 10)  # full: 20 joins, 10 leaves, 10 crashes
    result: Obj = bench_rebalance.run(partitions=64, members=4, rounds=rounds,
                                      crash_rounds=crashes, swarm=False)
    return result


def rebalance_large(quick: bool) -> Obj:
    rounds, crashes = (2, 1) if quick else (10, 3)  # full: 10 joins, 7 leaves, 3 crashes
    result: Obj = bench_rebalance.run(partitions=1024, members=32, rounds=rounds,
                                      crash_rounds=crashes, swarm=True)
    return result


SCALE_PROCESSES = 4  # swarm processes for the full sizes: one loop cannot carry 200 members


def scale(quick: bool) -> Obj:
    sizes = [(1000, 50), (100, 50), (1000, 10)] if quick else [
        (10_000, 200), (1_000, 200), (10_000, 50)]
    window = 10.0 if quick else 30.0
    return {"sizes": [bench_scale.one(p, m, window=window, timeout=900,
                                      processes=1 if quick else SCALE_PROCESSES)
                      for p, m in sizes]}


def assignor(quick: bool) -> Obj:
    sizes = [(10_000, 200)] if quick else [(10_000, 200), (50_000, 1_000)]
    rows = [r for n, m in sizes for a in ("sticky", "range")
            for r in bench_assignor.bench(a, n, m, 5 if quick else 7)]
    return {"rows": rows, "kafka_reference": {
        "what": "KIP-848 broker-side uniform assignor, 50,000 partitions x 1,000 members, Java",
        "ms": list(KAFKA_UNIFORM_MS), "source": "published in KIP-848, not measured here"}}


def pipeline(quick: bool) -> Obj:
    cmd = [sys.executable, str(REPO / "bench" / "bench_pipeline.py"),
           "--events", "60000" if quick else "300000",
           "--latency-seconds", "10" if quick else "30"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        return {"fell_short": done.stderr[-1500:]}
    data: Obj = json.loads((OUT / "pipeline.json").read_text())
    return data


SECTIONS: dict[str, Callable[[bool], Obj]] = {
    "rebalance": rebalance, "rebalance_large": rebalance_large, "scale": scale,
    "assignor": assignor, "pipeline": pipeline,
}


def _f(x: Any, digits: int = 2) -> str:
    if isinstance(x, (int, float)) and x == x:  # not NaN
        return f"{x:.{digits}f}" if isinstance(x, float) else str(x)
    return "—"


def table(results: Obj) -> str:
    lines = ["| figure | kgroup (measured here) | compared with |", "|---|---|---|"]
    for key, label in (("rebalance", "64 partitions, 4 → 5 members"),
                       ("rebalance_large", "1,024 partitions, 32 → 33 members (swarm)")):
        r = results.get(key, {}).get("figures")
        if not r:
            continue
        lines.append(
            f"| join, {label}: session → moved partitions owned | p50 {_f(r['join_p50_s'])} s, "
            f"p95 {_f(r['join_p95_s'])} s ({r['join_runs']} runs; + window, 0 here) | "
            "KIP-848: revoke-then-assign over heartbeats (seconds) |")
        lines.append(
            f"| partitions moved vs lower bound ({label}) | {r['moved']} vs {r['lower_bound']}; "
            f"pauses of unmoved partitions: {r['unmoved_pauses']}; overlaps of ownership in "
            f"the audit: {r.get('safety_violations', '—')} | eager protocols stop all |")
        lines.append(
            f"| leave (SIGTERM), {label} | p50 {_f(pct(r.get('leaves', []), 0.5))} s, "
            f"p95 {_f(pct(r.get('leaves', []), 0.95))} s ({r.get('leave_runs', '?')} runs) "
            "| KCL: lease handed over on shutdown |")
        lines.append(
            f"| crash (SIGKILL), {label} | p50 {_f(pct(r.get('crashes', []), 0.5))} s, "
            f"p95 {_f(pct(r.get('crashes', []), 0.95))} s ({r.get('crash_runs', '?')} runs; "
            "lease 15 s) | KCL: failover after lease expiry |")
    for s in results.get("scale", {}).get("figures", {}).get("sizes", []):
        procs = s.get("swarm_processes", 1)
        size = f"{s['partitions']:,} x {s['members']}" + (
            f" ({procs} swarm processes)" if procs > 1 else "")
        if "ns_writes_per_s" not in s:
            swarms = [x for x in s.get("swarms", []) if "fencings" in x]
            why = (f"; fencings {sum(x['fencings'] for x in swarms)}, worst loop lag "
                   f"{max(x['lag_max_s'] for x in swarms):.1f} s" if swarms else "")
            short = str(s.get("fell_short", "?")).split(" (last:")[0]
            lines.append(f"| scale {size} | fell short ({short}){why} | |")
            continue
        kcl = s["partitions"] / 2.0
        lines.append(
            f"| scale {size}: empty → Stable; join; leave | {_f(s['empty_to_stable_s'], 1)} s; "
            f"{_f(s['join_to_stable_s'], 1)} s; {_f(s['leave_to_stable_s'], 1)} s; "
            f"fencings {s.get('fencings_total', '—')}; operator "
            f"{_f(s.get('operator_cpu_s_to_stable'), 1)} CPU-s to Stable, "
            f"{_f(s.get('operator_cpu_s_per_min_stable'), 1)} CPU-s/min while stable | |")
        lines.append(
            f"| Lease writes/s while stable, {size} | {_f(s['ns_writes_per_s'])} "
            f"(members ÷ 5 s = {s['members'] / 5:.0f}) | KCL-style per-partition renewal "
            f"at 2 s: {kcl:,.0f}/s |")
    a = results.get("assignor", {}).get("figures")
    if a:
        for row in a["rows"]:
            if row["assignor"] == "sticky" and row["case"] in ("join", "leave"):
                lines.append(
                    f"| sticky assignor {row['partitions']:,} x {row['members']}, {row['case']} "
                    f"| median {row['median_ms']} ms, max {row['max_ms']} ms, moved "
                    f"{row['moved']} (bound {row['lower_bound']}) | Kafka uniform 50,000 x 1,000: "
                    f"15-20 ms (published) |")
    p = results.get("pipeline", {}).get("figures")
    if p and "results" in p:
        for row in p["results"]:
            lines.append(f"| pipeline: {row['consumer']} (16 partitions) | "
                         f"{row['events_per_s']:,.0f} events/s | "
                         f"{row['ratio_to_raw']:.2f} x raw XRANGE |")
        lines += pipeline_rows(p)
    return "\n".join(lines) + "\n"


def _n(x: Any) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) and x == x else "—"


def pipeline_rows(p: Obj) -> list[str]:
    """3 drivers against 1 (same harness, same master) and produce → commit latency."""
    lines = []
    three, one = p.get("spark3", {}), p.get("spark3", {}).get("single", {})
    if "drain_eps" in three and "drain_eps" in one:
        lines.append(
            f"| pipeline: 3 PySpark workers together ({', '.join(three['shares'])}; own "
            f"driver each, {three['master']}) | drain {three['drain_eps']:,.0f} events/s, "
            f"steady {_n(three['steady_eps'])} events/s; rows per worker "
            f"{three['backlog_rows_per_worker']}; lost {three['lost']}, duplicated "
            f"{three['duplicated']} | 1 worker: drain {one['drain_eps']:,.0f}, steady "
            f"{_n(one['steady_eps'])} events/s; x{three['ratio_to_single']:.2f} "
            f"(drain) on {p.get('meta', {}).get('cpus', '?')} shared cores |")
    elif "fell_short" in three:
        lines.append(f"| pipeline: 3 PySpark workers together | fell short "
                     f"({three['fell_short'][:120]}) | |")
    lat = p.get("latency", {})
    for key, label in (("workers_1", "1 worker"), ("workers_3", "3 workers")):
        if key in lat:
            r = lat[key]
            lines.append(
                f"| pipeline: produce → commit latency, {label}, {r['produced_eps']:,.0f} "
                f"events/s | p50 {r['p50_ms']:,.0f} ms, p95 {r['p95_ms']:,.0f} ms, max "
                f"{r['max_ms']:,.0f} ms ({int(r['events']):,} events; upper bounds, poll gap "
                f"p50 {r['poll_gap_p50_ms']:.0f} ms) | micro-batch trigger every 250 ms |")
    return lines


def _caption(results: Obj, key: str) -> str:
    entry = results[key]
    return f"{entry['machine_line']}\n{entry['command']}"


def plots(results: Obj) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    rb = results.get("rebalance", {}).get("figures")
    if rb and rb.get("joins"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        data = [rb["joins"], rb["leaves"] or [float("nan")], rb["crashes"] or [float("nan")]]
        ax.boxplot(data, tick_labels=["join", "leave (SIGTERM)", "crash (SIGKILL)"])
        ax.set_ylabel("seconds until every moved partition is owned")
        ax.set_title(f"64 partitions, 4 ↔ 5 sidecar processes; window 0, lease 15 s\n"
                     f"{_caption(results, 'rebalance')}", fontsize=8)
        fig.tight_layout()
        fig.savefig(OUT / "rebalance.png", dpi=110)
        plt.close(fig)
        made.append("rebalance.png")
    sc = [s for s in results.get("scale", {}).get("figures", {}).get("sizes", [])
          if "ns_writes_per_s" in s]
    if sc:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = [f"{s['partitions']}x{s['members']}" for s in sc]
        ax.bar(names, [s["ns_writes_per_s"] for s in sc], label="kgroup (measured)")
        ax.plot(names, [s["members"] / 5 for s in sc], "k_", markersize=30,
                label="members ÷ renew interval")
        ax.set_ylabel("Lease writes/s while stable")
        ax.set_yscale("log")
        ax.set_title("Writes track members, not partitions (KCL-style 10,000 partitions at "
                     "2 s: 5,000/s)\n" + _caption(results, "scale"), fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(OUT / "scale_writes.png", dpi=110)
        plt.close(fig)
        made.append("scale_writes.png")
    a = results.get("assignor", {}).get("figures")
    if a:
        rows = [r for r in a["rows"] if r["assignor"] == "sticky" and r["case"] != "initial"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = [f"{r['partitions']}x{r['members']}\n{r['case']}" for r in rows]
        ax.bar(names, [r["median_ms"] for r in rows], label="kgroup sticky, median (Python)")
        ax.axhspan(*KAFKA_UNIFORM_MS, color="orange", alpha=0.3,
                   label="Kafka uniform 50,000x1,000 (published, Java)")
        ax.set_ylabel("ms per assignment")
        ax.set_title(_caption(results, "assignor"), fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(OUT / "assignor.png", dpi=110)
        plt.close(fig)
        made.append("assignor.png")
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer runs")
    ap.add_argument("--render-only", action="store_true", help="table and plots only")
    args = ap.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    OUT.mkdir(parents=True, exist_ok=True)
    results: Obj = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.render_only:
        cl = cluster() if set(chosen) - {"assignor", "pipeline"} else None
        for name in chosen:
            print(f"== {name}", flush=True)
            t0 = time.monotonic()
            try:
                figures = SECTIONS[name](args.quick)
            except Exception as exc:  # one section failing must not lose the others
                figures = {"fell_short": f"{type(exc).__name__}: {exc}"[:500]}
            facts = machine(cl)
            results[name] = {
                "figures": figures, "machine": facts, "quick": args.quick,
                "seconds": round(time.monotonic() - t0, 1),
                "command": f".venv/bin/python bench/run_all.py --only {name}"
                           + (" --quick" if args.quick else ""),
                "machine_line": (f"{facts['nproc']} cores, {facts['memory_gb']} GB, k8s "
                                 f"{facts.get('kubernetes', '?')}, Python {facts['python']}, "
                                 f"pyspark {facts.get('pyspark', '?')}; load "
                                 f"{facts['load_average'][0]}"),
            }
            RESULTS.write_text(json.dumps(results, indent=1, default=str) + "\n")
            print(json.dumps({k: v for k, v in figures.items()
                              if k not in ("joins", "leaves", "crashes", "rows")},
                             indent=1, default=str)[:3000], flush=True)
    (OUT / "table.md").write_text(table(results))
    made = plots(results)
    print(f"wrote {RESULTS}, {OUT / 'table.md'}, {', '.join(made)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
