"""Print one hash per pinned simulation seed: the seed's whole trace and verdict.

A code move must leave every line unchanged (run it before and after, compare):

    .venv/bin/python scripts/sim_trace_hashes.py > before.txt
    ... move ...
    .venv/bin/python scripts/sim_trace_hashes.py | diff before.txt -

The seeds are the ones tests/test_simulation.py pins, under the configurations it runs
them with (the shipped code and the broken variants it brings back).
"""

from __future__ import annotations

import hashlib
import sys

from kgroup_sim import FAULT_KINDS, SimConfig, run_seed
from kgroup_sim.variants import (
    EarlyExpiry,
    MarkerCompareExpiry,
    NoAdoptionMember,
    NoMarkMember,
    NoRereadExpiry,
)
from kgroup_sim.world import HAND_EDIT_KINDS

PINNED = (0, 1, 2, 3, 4, 7, 11, 12, 14, 15, 179)
SMALL = SimConfig(members=4, partitions=16, fault_time=30, verbose=True)
WHOLE = SimConfig(**{**SMALL.__dict__, "scoped_watch": False})
LOSSY = SimConfig(**{**WHOLE.__dict__, "event_loss": 0.3, "relist": (20.0, 30.0)})
FAST_RELIST = SimConfig(**{**WHOLE.__dict__, "relist": (0.3, 1.0), "slow": 0.2})
CONFIGS: dict[str, SimConfig] = {
    "small": SMALL,
    "whole": WHOLE,
    "lossy": LOSSY,
    "fast-relist": FAST_RELIST,
    "hand-edits": SimConfig(**{**SMALL.__dict__, "kinds": FAULT_KINDS + HAND_EDIT_KINDS}),
    "no-reread": SimConfig(**{**LOSSY.__dict__, "expiry_rule": NoRereadExpiry}),
    "marker-compare": SimConfig(**{**LOSSY.__dict__, "expiry_rule": MarkerCompareExpiry}),
    "early-expiry": SimConfig(**{**SMALL.__dict__, "expiry_rule": EarlyExpiry}),
    "no-adoption": SimConfig(**{**SMALL.__dict__, "member_factory": NoAdoptionMember}),
    "no-mark": SimConfig(**{**SMALL.__dict__, "member_factory": NoMarkMember,
                            "expiry_admission": False}),
    "stale-relist": SimConfig(**{**FAST_RELIST.__dict__,
                                 "regressions": frozenset({"stale-relist"})}),
}


def trace_hash(seed: int, cfg: SimConfig) -> str:
    result = run_seed(seed, cfg)
    h = hashlib.sha256()
    for line in result.trace:
        h.update(line.encode() + b"\n")
    h.update(repr((result.events, result.store_writes, result.converged_after,
                   result.sim_time, result.sink_accepted, result.sink_refused,
                   sorted(result.faults.items()),
                   [(v.kind, v.step, v.time, v.detail) for v in result.violations])).encode())
    return h.hexdigest()[:16]


def main() -> int:
    names = sys.argv[1:] or sorted(CONFIGS)
    for name in names:
        for seed in PINNED:
            print(f"{name} seed={seed} {trace_hash(seed, CONFIGS[name])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
